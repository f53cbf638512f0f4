"""Which of a run's weights the Train page opens (issue 76, item 7): best.pt and last.pt, each named by the epoch and
the validation accuracy its checkpoint records."""

from test_catalog import write_checkpoint

from vit.runs.weights import saved_weights


def test_a_run_offers_its_best_and_its_last_weights_each_with_its_epoch_and_accuracy(tmp_path):
    write_checkpoint(tmp_path / "best.pt", epochs=1, val_acc=0.125)
    write_checkpoint(tmp_path / "last.pt", epochs=60, val_acc=0.0625)
    best, last = saved_weights(tmp_path)
    assert (best.which, best.path, best.epoch, best.val_acc) == ("best", tmp_path / "best.pt", 1, 0.125)
    assert (last.which, last.path, last.epoch, last.val_acc) == ("last", tmp_path / "last.pt", 60, 0.0625)
    assert best.label == "best weights: epoch 1, val acc 12.5 %"
    assert last.label == "last weights: epoch 60, val acc 6.2 %"
    assert "highest validation accuracy" in best.help and "latest" in last.help


def test_the_epoch_is_the_checkpoints_own_and_a_rewritten_file_is_read_again(tmp_path):
    write_checkpoint(tmp_path / "last.pt", epochs=3, val_acc=0.5)
    assert [w.label for w in saved_weights(tmp_path)] == ["last weights: epoch 3, val acc 50.0 %"]
    write_checkpoint(tmp_path / "last.pt", epochs=4, val_acc=0.75, note="a longer metadata: another size")
    assert [w.label for w in saved_weights(tmp_path)] == ["last weights: epoch 4, val acc 75.0 %"]


def test_weights_that_record_nothing_or_are_damaged_are_still_offered_by_name(tmp_path):
    write_checkpoint(tmp_path / "best.pt")
    (tmp_path / "last.pt").write_bytes(b"not a checkpoint")
    assert [w.label for w in saved_weights(tmp_path)] == ["best weights", "last weights"]


def test_a_run_without_weights_offers_none(tmp_path):
    assert saved_weights(tmp_path) == []
