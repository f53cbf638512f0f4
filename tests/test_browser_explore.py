"""``vit.explore(model)`` in a real browser (issue 117, item 5): a notebook's process (here a child Python) holds a
tiny timm ViT built with random weights by timm itself, and calls ``vit.explore`` on the object; the page it serves
from that process, on 127.0.0.1, names the model and draws its map over an uploaded image; closing the tab returns
the call, and a second call's ``stop()`` stops the server it started again. The map on the page is the module's own
attention: the child's forward hook on the last block's attention computes ``softmax(q k^T * scale)`` from that
module's own ``qkv`` weights and input (not our recorder), the heads' mean of the CLS row over the patches, which
the page's chart must carry patch for patch (row-major). The notebook refuses ``torch.save`` and pickling the module
(or its tensors) while it serves: nothing of it is written or pickled."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import BROWSER_TIMEOUT_MS, ROOT, chromium
from test_browser_explorer import SCRIPT_DONE, png

pytest.importorskip("timm")
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.scenario]

NAME = "my tiny timm ViT"
# The notebook: the model, a reference hook on its last attention (the test's, not the project's), vit.explore.
NOTEBOOK = f"""
import json, sys
import timm, torch
import vit
torch.manual_seed(0)
model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(32, 48), patch_size=8, depth=2,
                          embed_dim=32, num_heads=2, num_classes=3).eval()
def reference(attention, args):
    x = args[0]
    B, N, C = x.shape
    qkv = attention.qkv(x).reshape(B, N, 3, attention.num_heads, C // attention.num_heads).permute(2, 0, 3, 1, 4)
    q, k = attention.q_norm(qkv[0]), attention.k_norm(qkv[1])
    rows = ((q * attention.scale) @ k.transpose(-2, -1)).softmax(-1)[0].mean(0)[0, 1:]
    with open(sys.argv[1], "w") as f:
        json.dump(rows.tolist(), f)
model.blocks[-1].attn.register_forward_pre_hook(reference)
import pickle
def refuse(*args, **kwargs):  # nothing of the module is pickled or saved, the page's whole work included
    print("PICKLED", flush=True)
    raise AssertionError("pickled or saved")
def of_the_model(value):  # the module, a tensor, a checkpoint holding it, or a state dict
    values = value.values() if isinstance(value, dict) else [value, getattr(value, "model", None)]
    return any(isinstance(v, (torch.nn.Module, torch.Tensor)) for v in values)
def guarded(pickles):  # other objects pickle as ever (jinja2 pickles its version at its import)
    return lambda value, *args, **kwargs: (refuse() if of_the_model(value) else pickles(value, *args, **kwargs))
torch.save = refuse
pickle.dump, pickle.dumps = guarded(pickle.dump), guarded(pickle.dumps)
vit.explore(model, name={NAME!r}, open_browser=False)
print("RETURNED", flush=True)
import urllib.request
page = vit.explore(model, block=False, open_browser=False)  # a second server of this process, stopped by its call
health = page.url.split("/?")[0] + "/_stcore/health"
assert urllib.request.urlopen(health, timeout=30).status == 200
page.stop()
try:
    urllib.request.urlopen(health, timeout=5)
except OSError:
    print("STOPPED", flush=True)
"""

CUSTOMDATA = """() => {
  const chart = document.querySelector('.st-key-library_map_picker .js-plotly-plot');
  return chart && chart._fullData && chart._fullData[0] ? Array.from(chart._fullData[0].customdata) : null;
}"""


def url_from(process: subprocess.Popen, timeout: float) -> str:
    """The page's URL as ``vit.explore`` prints it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            raise RuntimeError(f"the notebook exited ({process.returncode}) before serving the page")
        if line.startswith("The explorer on"):
            return line.split(": ", 1)[1].split()[0]
    raise TimeoutError("vit.explore printed no URL")


def test_explore_opens_the_page_on_a_module_in_hand_and_returns_when_it_is_closed(tmp_path):
    reference = tmp_path / "reference.json"
    image = tmp_path / "photo.png"
    image.write_bytes(png(60, 40, seed=1))
    process = subprocess.Popen([sys.executable, "-c", NOTEBOOK, str(reference)], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = url_from(process, 180)
        assert url.startswith("http://127.0.0.1:") and "model=in-hand%3A" in url
        with chromium() as browser:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            page.goto(url)
            page.get_by_text(NAME, exact=False).first.wait_for()
            page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(image))
            page.locator(".st-key-library_map_picker .js-plotly-plot").wait_for()
            page.wait_for_function(SCRIPT_DONE)
            drawn = page.evaluate(CUSTOMDATA)
            assert drawn is not None and len(drawn) == 4 * 6  # the 32 x 48 input's 8-px patches
            expected = json.loads(reference.read_text())
            assert np.allclose(drawn, expected, atol=1e-5)
            assert not np.allclose(drawn, np.mean(expected))  # random weights attend unevenly: a real map
            context.close()  # the tab closed: the call returns
        process.wait(timeout=60)
        assert process.returncode == 0
        rest = process.stdout.read()
        assert "RETURNED" in rest and "STOPPED" in rest and "PICKLED" not in rest, rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=15)
