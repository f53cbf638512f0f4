"""Inside the VLM's language model (issue 115): attention knockout and activation patching at any layer and head,
the heads that ground an answer, and the visual sink tokens. Each acts through the recording attention the answer
already runs its language model with; ``VLMAnswer`` exposes them (``knockout``, ``patch``, ``grounding_heads``,
``visual_heads``, ``sinks``)."""
