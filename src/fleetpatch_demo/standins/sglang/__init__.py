"""Stand-in SGLang server: SGLang's real startup path, without torch or a GPU.

This package is installed on demo/test hosts as ``sglang_standin/`` in the
host's site-packages (next to a real ``sglang/`` source tree taken from the PyPI
wheel, and to the shared ``fleetpatch_standin_common/``; see
fleetpatch_demo/standinsite.py) and started exactly like SGLang::

    <python> -m sglang_standin --model-path /models/x --speculative-algorithm EAGLE3 \
        --speculative-num-steps 3 --speculative-eagle-topk 4 \
        --speculative-num-draft-tokens 8 --port 30000 [--tp-size 2] [--host 127.0.0.1]

It accepts the same flags as ``python -m sglang.launch_server`` of the installed
version because it builds the parser with the tree's REAL
``sglang.srt.server_args.ServerArgs.add_cli_args``: a flag that a patch adds to
``server_args.py`` is accepted, an unknown flag is an argparse error (exit 2).

What runs for real (from the host's tree) and what is simulated:

* A ``sys.meta_path`` finder serves permissive stub modules for everything the
  tree does not contain (torch, triton, sgl_kernel, numpy, transformers, and
  every ``sglang.*`` module outside ``server_args.py`` / ``speculative/``).
  GPU/ML libraries (FORCE_STUB) are always stubbed, even if installed. Files
  that exist in the tree are always imported for real; a module missing from
  ``sglang/srt/speculative/`` (which the tree holds completely) is a genuine
  ImportError. A handful of names whose values matter (``envs`` of
  sglang.srt.environ, is_cuda/is_hip/..., get_bool_env_var, nullable_str,
  TpModelWorker, ModelConfig, ...) get concrete stand-ins (stubrules.py).
* ``ServerArgs`` is built from the parsed flags with the tree's own
  ``from_cli_args`` while ``__post_init__`` (hardware probing) is skipped.
  Then the tree's real handlers that the routing depends on run, in
  ``__post_init__`` order (serverargs.py's _POST_INIT_STEPS: missing defaults, GPU memory
  settings for an 80 GB GPU, attention backend, page size, pipeline
  parallelism, ``_handle_speculative_decoding``), then the real
  ``check_server_args``. Through 0.5.12 that is where the routing happens:
  NEXTN -> EAGLE, ``SGLANG_ENABLE_SPEC_V2`` -> overlap on/off, the "Overlap
  scheduler is disabled ..." / "Spec v2 is enabled ..." warnings (printed bare
  to stderr because logging is not configured yet, as in SGLang), the
  topk > 1 ValueError, the pp AssertionError. 0.5.13+ moved the speculative
  handling into sglang/srt/arg_groups/ (not in the tree); for those versions
  _handle_speculative_decoding_v2_only replicates it.
* Logging is configured like SGLang (``[%Y-%m-%d %H:%M:%S] message``) and
  ``server_args=ServerArgs(...)`` (the dataclass repr) is logged.
* For each TP rank (``--tp-size``) the draft worker class is chosen by the
  tree's real ``SpeculativeAlgorithm.create_worker`` (0.5.8+) or its registry
  (``create_draft_worker``, 0.5.7), imported from the tree and CONSTRUCTED with
  the scheduler's arguments, so every line of its real ``__init__`` runs
  (including ``logger.info`` calls a patch adds, and any genuine error, which
  is logged as "Scheduler hit an exception: Traceback ..." and exits 1).
  The target ``TpModelWorker`` / ``ModelRunner`` are simulated objects; the
  real draft cuda-graph runners of the tree run (their capture is a stub).
  With tp_size > 1 the log prefix is ``[ts TP<rank>] `` like SGLang's scheduler.
* An HTTP server answers ``GET /health``, ``/health_generate`` (503 until
  ready, then 200), ``/server_info`` (every ServerArgs field, ``version``,
  ``internal_states``) and ``/get_server_info`` (same, logs the deprecation
  warning), ``/model_info`` (the router asks for it when a worker is added),
  with uvicorn-style access log lines.
* Serving like 0.5.9: ``POST /generate`` (``{"text", "sampling_params":
  {"max_new_tokens": N}, "stream"}``) takes N x FLEETPATCH_STANDIN_TOKEN_SECONDS
  and answers ``{"text", "output_ids", "meta_info"}``, or with ``"stream":
  true`` server-sent events ``data: {...}`` (one per token, cumulative text,
  chunked transfer encoding) ending ``data: [DONE]``. At most
  ``--max-running-requests`` (default 48) run; the rest wait. ``GET /v1/loads``
  (``aggregate.total_running_reqs`` / ``total_waiting_reqs``) and the
  deprecated ``GET /get_load`` (logs its deprecation warning) count them.
  One scheduler loop (steps.py): at each step the constructed worker of every TP
  rank runs its REAL ``forward_batch_generation`` once, with an EXTEND batch of
  the requests that arrived since the last step, then a DECODE batch holding
  every running request (one token each per step). Before its ready line the
  server sends itself 0.5.9's warmup request (``GET /model_info``, then
  ``POST /generate``), unless started with ``--skip-server-warmup``. Only the model-running steps it calls (draft, verify,
  forward_target_extend, the draft-extend helpers; _GPU_STEPS) are stubbed on
  the instance (workers.py), so a line a patch logs in forward_batch_generation (or in a
  helper of its own) really executes. An exception there is logged as
  "Scheduler hit an exception: Traceback ..." and the server exits 1, the
  request's connection dropped, as when a real scheduler dies.
* SIGTERM after ready is 0.5.9's graceful exit: the server keeps serving
  (new /generate requests included) while ``/health`` answers 503; every
  FLEETPATCH_STANDIN_SIGTERM_POLL seconds (SGLang's watchdog: 5) it logs
  "Gracefully exiting... Remaining number of requests N ..." and exits 0 once
  N is 0. (Real SGLang then SIGKILLs its own process tree; the stand-in exits
  0.) SIGINT, and SIGTERM before ready, stop it at once with exit code 0.

* Multi-node (``--nnodes N --node-rank R --dist-init-addr HOST:PORT``, the real
  flags): each node builds only its own TP ranks (engine.py's rank ranges: with
  ``--tp-size 2 --nnodes 2`` node 0 runs TP0 and node 1 TP1), from ITS host's
  tree, under its ranks' prefixes. Before its first rank's worker, each node
  logs the release's "Init torch distributed begin." (0.5.21+: "Init parallel
  begin.") and meets the others in a real TCP rendezvous, as
  torch.distributed's TCPStore does: node 0 listens on PORT (all interfaces),
  the others connect to HOST:PORT, retrying until the deadline, and say their
  ranks; nobody goes on until all ``tp_size * pp_size`` ranks have joined. A
  timeout is the scheduler's exception, as torch raises it (node 0:
  ``torch.distributed.DistStoreError: Timed out after S seconds waiting for
  clients. J/W clients joined.``; node R: ``torch.distributed.DistNetworkError:
  The client socket has timed out after Mms while trying to connect to (HOST,
  PORT).``), then the server exits 1. Node 0 serves HTTP as above; nodes R >= 1
  serve only SGLang's launch_dummy_health_check_server on ``--port`` (GET
  /health, /health_generate, /ping answer 200, everything else 404, no access
  log), log "Dummy health check server started in background thread at
  HOST:PORT" and wait. Each step node 0's workers run is sent to the other
  nodes, whose workers run it too (TP ranks step together); a node that has
  gone is left out, so node 0 keeps serving (upstream issue #3099). When node 0
  goes away a node R >= 1 dies as its scheduler would (the gloo connection
  closed), except after 0.5.21+'s graceful shutdown (ShutdownReq: exit 0);
  SIGTERM on a node R >= 1 exits at once before 0.5.21, and from 0.5.21 is
  logged and waits for node 0's shutdown, as in engine.py.

Faithful consequences worth knowing: like real SGLang, EAGLE launches that
give ``--speculative-eagle-topk`` without ``--speculative-num-steps`` fail with
a bare AssertionError in _handle_speculative_decoding; and
``--enable-multi-layer-eagle`` on the v1 path of 0.5.9 - 0.5.12 fails with
``NameError: name 'ModelRunner' is not defined`` (an upstream bug in
multi_layer_eagle_worker.py). Without a readable ``<model-path>/config.json``
the model is taken to be a Llama checkpoint.

The stand-in never reads patch markers and never prints a line a patch would
print: only code from the tree can produce those.

Test-control environment variables:

``FLEETPATCH_STANDIN_STARTUP_DELAY``
    seconds to sleep before the ready line (model load), default 0.2.
``FLEETPATCH_STANDIN_CRASH_AFTER_INIT=1``
    after the worker is constructed, log a scheduler failure (RuntimeError
    traceback) and exit 1 before ready.
``FLEETPATCH_STANDIN_NEVER_READY=1``
    never print the ready line; /health stays 503; keeps running.
``FLEETPATCH_STANDIN_ROTATE_LOG=<path>``
    after the server_args line and before the worker is constructed, rotate the
    log like logrotate: rename <path> to <path>.1, open a new <path> for append
    and dup2 it onto fds 1 and 2.
``FLEETPATCH_STANDIN_EXIT_AFTER_READY=<seconds>``
    exit 1 with a traceback that many seconds after the ready line.
``FLEETPATCH_STANDIN_TOKEN_SECONDS``
    seconds per generated token, default 0.01.
``SGLANG_RUST_SERVER=1``
    as in SGLANG 0.5.22+: no uvicorn lines, and the ready line is the Rust
    server's (same text, tracing's format, on stdout). Earlier releases log
    Python's ready line as without it.
``FLEETPATCH_STANDIN_SIGTERM_POLL``
    seconds between the SIGTERM watchdog's checks, default 0.5 (SGLang: 5).
``FLEETPATCH_STANDIN_DIST_TIMEOUT``
    seconds the multi-node rendezvous waits (every node), default
    ``--dist-timeout`` or else 600 (torch's NCCL process-group default).
``FLEETPATCH_STANDIN_FAIL_RANK=<R>`` (with ``FLEETPATCH_STANDIN_FAIL_AFTER_S``)
    node R's scheduler dies that many seconds (default 0) after its node is up
    (node 0: ready; others: dummy health server up): "Scheduler hit an
    exception: Traceback ...", then exit 1. The other nodes carry on.
``FLEETPATCH_STANDIN_SPAWN_SCHEDULER=1``
    like SGLang, build each rank's draft worker in a scheduler process started
    with multiprocessing spawn (a fresh interpreter: site runs again there), not
    in the server's own process; the scheduler stays until the server exits.
    The server itself then constructs no worker (its /generate runs none).

Stdlib only; Python 3.8+.

Modules (one concern each; relative imports inside the package, the common package by
its installed name):

* ``__main__``: ``python -m sglang_standin``; ``main``: the server's life.
* ``stubrules``: what is stubbed and what is concrete; ``envs``, ``srtutils``, ``models``,
  ``argutils``, ``msgspec_standin``: the concrete stand-ins.
* ``serverargs``: flags, routing, checks, logging format; ``release``: the tree's version.
* ``workers``: the draft worker's choice and construction, its stubbed GPU steps, batches.
* ``state``: the server's state and request counts; ``scheduler``: a step on every rank,
  loads, scheduler death, the spawned scheduler; ``steps``: the scheduler loop and warmup.
* ``handler``: the HTTP API, warmup and ready line; ``nodes``: multi-node launches.
"""
