"""A vLLM stand-in server for fleetpatch's demo and tests: the real engine files of a host's
vLLM release run (the drafter or speculator the launch selects, vllm/envs.py), without torch or
a GPU; every vLLM log line it writes is quoted from the host's files.

On a host it is installed as ``site-packages/vllm_standin/`` (``install.install_standin``) next to
the real ``vllm/`` files and started like ``vllm serve``::

    python -m vllm_standin serve MODEL [--speculative-config JSON] [--tensor-parallel-size N] ...
    python -m vllm_standin.api_server --model MODEL ...

One module per concern: host (the install, per-process set-up), stubs (imports the host lacks),
logs (format, quoting), routing (engine, runner, drafter), processes (API server, EngineCore,
workers), drafter (build, propose), compile_cache, http_api, main.
"""
