"""The stand-in servers: each engine's real startup path without torch or a GPU.

Subpackages (each copied onto a demo/test host's site-packages under its own name by
fleetpatch_demo.standinsite; nothing here is imported by the demo itself):

* ``common/``: the engine-neutral parts: import stubs for the modules a host lacks, the
  threading HTTP server, output and log handling, the serving loop and its signals.
  Installed as ``fleetpatch_standin_common``; the engines' packages import it by that name.
* ``sglang/``: the SGLang stand-in, installed as ``sglang_standin`` and started as
  ``python -m sglang_standin <SGLang's launch flags>``.
* ``vllm/``: the vLLM stand-in, installed as ``vllm_standin`` (``vllm/install.py``) and started as
  ``python -m vllm_standin serve MODEL <vLLM's flags>``.

Host-side code: stdlib only, Python 3.8+.
"""
