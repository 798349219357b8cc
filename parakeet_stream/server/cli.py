"""`parakeet-serve`: the streaming ASR server."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable

import trio

from ..arguments import ArgumentParser
from ..engine import ASREngine, EngineError
from ..engine.diarizer_model import DEFAULT_LATENCY, LATENCIES
from ..engine.info import EngineInfo
from ..engine.options import CPU_SLOTS, add_engine_arguments, default_slots, engine_options, whole_number
from ..host import single_threaded_host
from ..model.device import AUTO, check_device, resolve_device
from ..model.config import UnsupportedModel
from ..model.convert import ConvertError
from ..model.errors import DeviceError, ModelNotFound
from ..model.loading import check_lookaheads
from ..model.precision import AUTO, PrecisionError
from ..model.registry import HUB_ALIASES
from .app import serve
from .context import ServerConfig, ServerContext
from .operations.memory import freeze_startup_objects
from .operations.ports import port_problem
from .operations.workers import default_workers, serve_in_workers
from .streams.guard import auto_limit, memory_problem
from .transport.codes import ProtocolError


MAX_PORT = 65535
ENV_PREFIX = "PARAKEET_"
EPILOG = ("Every option that takes a value may also come from the environment: PARAKEET_ and the option's name in "
          "capitals, - as _ (PARAKEET_DRAIN_TIMEOUT=60 is --drain-timeout 60); the command line wins. "
          "It prints its configuration, then one `parakeet-serve ready: ...` line. Ctrl-C (or SIGTERM) stops taking "
          "streams and lets active ones finish; a second Ctrl-C stops at once.")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class _EnvParser(ArgumentParser):
    """Reads PARAKEET_<OPTION> variables as if they came first on the command line, so that flags
    given there win and every value is checked as a flag's is (a container is configured either way)."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        given = {arg.split("=")[0] for arg in args}
        self._from_env = {flag: found for flag, found in env_flags(self).items() if flag not in given}
        return super().parse_known_args([f"{flag}={value}" for flag, (_, value) in self._from_env.items()] + args,
                                        namespace)

    def error(self, message: str):
        for flag, (variable, _) in getattr(self, "_from_env", {}).items():
            if message.startswith(f"argument {flag}"):
                message += f" (from {variable})"
        super().error(message)


def env_flags(parser: argparse.ArgumentParser) -> dict[str, tuple[str, str]]:
    """flag -> (variable, value) for each option with a value that a non-empty PARAKEET_<OPTION> sets."""
    found = {}
    for action in parser._actions:
        variable = ENV_PREFIX + action.dest.upper()
        if action.option_strings and action.nargs != 0 and os.environ.get(variable):
            found[action.option_strings[0]] = (variable, os.environ[variable])
    return found


def build_parser() -> argparse.ArgumentParser:
    p = _EnvParser(
        prog="parakeet-serve", description=__doc__, epilog=EPILOG, formatter_class=_HelpFormatter
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: everywhere)")
    p.add_argument("--port", type=_port, default=8765, help="raw TCP port, newline-delimited JSON (0: any free)")
    p.add_argument("--ws-port", type=_port, default=8000,
                   help="WebSocket port: native protocol, /v1/realtime, /v1/listen, /v2/listen (0: any free)")
    p.add_argument("--http-port", type=_port, default=8080,
                   help="HTTP port: the live captions page (open http://HOST:PORT/), /health, /ready, /metrics "
                        "(0: any free)")
    p.add_argument("--grpc-port", type=_grpc_port, default=50051,
                   help="gRPC port: NVIDIA Riva ASR, as nvidia-riva-client speaks it (0: any free; off: none)")
    p.add_argument("--model", default="demo",
                   help="demo (bundled, understands synthetic speech only), small, large or multilingual "
                        "(NVIDIA's, downloaded and converted once), a Hugging Face ORG/NAME[@REVISION] or a model folder; "
                        "scripts/serve.sh passes --model small")
    p.add_argument("--diarizer", default="off",
                   help="speaker diarization for the streams that ask for it: demo (bundled, synthetic voices only), "
                        "a Streaming Sortformer .nemo file (such as NVIDIA's diar_streaming_sortformer_4spk-v2) or a "
                        "folder holding one; off: none (default)")
    p.add_argument("--diarizer-latency", type=float, choices=sorted(LATENCIES), default=DEFAULT_LATENCY,
                   help="seconds of audio the diarizer's chunks wait for (NVIDIA's live settings): 1.04 (default) or "
                        "0.32, sooner at some accuracy; diarized streams' words wait for it")
    p.add_argument("--device", default=AUTO, help="torch device: auto (cuda where torch sees a GPU, else cpu), cpu, "
                                                  "cuda or cuda:N")
    p.add_argument("--max-num-streams", type=_slots,
                   help="engine slots: a number or 'auto' (as many as memory holds; default: auto on a GPU, "
                        f"{CPU_SLOTS} on a CPU)")
    p.add_argument("--max-queue", type=_queue, default=256, help="streams that may wait for a slot (0: none)")
    p.add_argument("--max-stream-seconds", type=float, default=3600.0, help="seconds of audio per stream (0: no limit)")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds: close a silent connection after this")
    p.add_argument("--send-timeout", type=float, default=5.0,
                   help="seconds: close a client that stops reading after this")
    p.add_argument("--max-message-bytes", type=int, default=1 << 20, help="largest line or WebSocket message")
    p.add_argument("--max-backlog-seconds", type=float, default=30.0, help="audio a stream may hold unprocessed")
    p.add_argument("--max-messages-per-second", type=float, default=1000.0, help="per connection (8 KiB counts 1)")
    p.add_argument("--handshake-timeout", type=float, default=5.0,
                   help="seconds for the WebSocket/HTTP handshake and the TCP API key")
    p.add_argument(
        "--drain-timeout", type=float, default=30.0,
        help="Ctrl-C or SIGTERM: active streams may go on this long, then are finalized (a second one: at once)",
    )
    p.add_argument("--max-upload-mb", type=float, default=100.0, help="largest HTTP upload (file transcription) in MB")
    p.add_argument("--max-uploads", type=int, default=8, help="HTTP uploads transcribed at once (more: 429)")
    p.add_argument("--max-upload-seconds", type=float, default=4 * 3600.0, help="longest audio in one HTTP upload")
    p.add_argument("--upload-timeout", type=float, default=600.0, help="seconds for an HTTP upload's body to arrive")
    p.add_argument("--agent-port", type=_port, default=None, help="HAProxy agent-check port (0: any free; default: none)")
    p.add_argument("--agent-weight-unit", type=int, default=1, help="agent weight: 1 point per this many free streams")
    p.add_argument("--api-key", default=None, help="require this key (Bearer header, ?api_key=, TCP first message)")
    p.add_argument("--allowed-origins", default="*", help="comma-separated WebSocket Origins, or *")
    p.add_argument("--workers", default="auto", type=_workers,
                   help="processes that speak the protocols, beside the engine's (0: all in one process; "
                        "auto: 0 on a CPU, one per four cores on a GPU, at most eight)")
    add_engine_arguments(p)
    p.add_argument("--check", action="store_true",
                   help="only check that the ports are free and the device usable, then exit (0: yes, 2: why not)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="what is logged on stderr (info: each connection's open and close, draining)")
    return p


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{port} is not a port: ports are 0 (any free one) to {MAX_PORT}")
    return port


def _grpc_port(value: str) -> int | None:
    return None if value == "off" else _port(value)


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of worker processes (0 or more) or auto")
    return count


def _slots(value: str) -> int | str:
    """`auto`, or a whole number of slots (0 would start a server that serves nobody)."""
    return value if value == "auto" else whole_number(value, "slots or 'auto'")


def _queue(value: str) -> int:
    return whole_number(value, "queue places", least=0)


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        tcp_port=args.port,
        ws_port=args.ws_port,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        api_key=args.api_key,
        allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
        max_message_bytes=args.max_message_bytes,
        max_backlog_seconds=args.max_backlog_seconds,
        max_messages_per_second=args.max_messages_per_second,
        handshake_timeout=args.handshake_timeout,
        max_stream_seconds=args.max_stream_seconds or None,
        idle_timeout=args.idle_timeout,
        send_timeout=args.send_timeout,
        drain_timeout=args.drain_timeout,
        agent_port=args.agent_port,
        agent_weight_unit=max(1, args.agent_weight_unit),
        model_name=args.model,
        max_upload_bytes=int(args.max_upload_mb * 2**20),
        max_uploads=max(1, args.max_uploads),
        max_upload_seconds=args.max_upload_seconds,
        upload_timeout=args.upload_timeout,
    )


def print_config(args: argparse.Namespace, info: EngineInfo, slots: int) -> None:
    print("parakeet-serve configuration:")
    for name, value in sorted(vars(args).items()):
        if name == "api_key":
            value = "set" if value else "none"
        elif name == "max_num_streams":  # the device's default where not given; what memory gave `auto`
            value = value or default_slots(args.device)
            value = f"{value} ({slots})" if value == "auto" else value
        elif name == "lookahead":  # the mode in use, the model's default unless given
            value = f"{info.default_lookahead[0]},{info.default_lookahead[1]}"
        elif name == "lookahead_modes":  # those served: every mode of the model unless given
            value = info.modes_text().replace(", ", " ")
        elif name == "workers" and value == "auto":
            value = f"auto ({_worker_count(args)})"
        elif name == "dtype" and value == AUTO:  # what the check chose (its reason is in the log)
            value = f"{value} ({info.precision.dtype})"
        print(f"  {name} = {value}")
    sys.stdout.flush()


def announce_ready(host: str):
    """What prints the `parakeet-serve ready: ...` line for the ports served."""

    def announce(ports: dict[str, int]) -> None:
        print(
            f"parakeet-serve ready: tcp://{host}:{ports['tcp']} ws://{host}:{ports['ws']} "
            f"http://{host}:{ports['http']}" + (f" agent://{host}:{ports['agent']}" if "agent" in ports else "")
            + (f" grpc://{host}:{ports['grpc']}" if "grpc" in ports else ""),
            flush=True,
        )

    return announce


async def run(ctx: ServerContext, announce: Callable[[dict[str, int]], None] | None = None) -> str:
    """Serve until SIGINT/SIGTERM has drained the streams ("drained") or a second signal cut the
    drain short ("not drained"); returns which. `announce(ports)` once listening (default: the
    ready line)."""
    outcome = ["drained"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, ctx, nursery.cancel_scope, outcome)
        ports = await nursery.start(_serve_then_stop, ctx, nursery.cancel_scope)
        (announce or announce_ready(ctx.config.host))(ports)
    return outcome[0]


async def _serve_then_stop(
    ctx: ServerContext, scope: trio.CancelScope, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    await serve(ctx, task_status=task_status)  # returns once drained
    scope.cancel()


async def _watch_signals(ctx: ServerContext, scope: trio.CancelScope, outcome: list[str]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if ctx.shutdown.is_set():  # a second signal: stop without waiting
                logging.getLogger(__name__).warning("%s again: stopping now (open connections cut: %d)",
                                                    signal.Signals(signum).name, ctx.open_sessions)
                outcome[0] = "not drained"
                scope.cancel()
                return
            logging.getLogger(__name__).info("%s: draining", signal.Signals(signum).name)
            ctx.shutdown.set()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.device = resolve_device(args.device)
    diarizer = None if args.diarizer == "off" else args.diarizer
    workers = _worker_count(args)
    problem = port_problem(args.host, _ports(args)) or (temp_problem() if workers else None)
    if problem:
        print(f"parakeet-serve: error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        try:
            check_device(args.device)
        except DeviceError as exc:
            print(f"parakeet-serve: error: {exc}", file=sys.stderr)
            return 2
        return 0
    try:  # (not with --check: scripts/serve.sh checks before it names the model)
        check_lookaheads(args.model, [mode for mode in (args.lookahead, *(args.lookahead_modes or ())) if mode])
    except ValueError as exc:
        print(f"parakeet-serve: error: {exc}", file=sys.stderr)
        return 2
    single_threaded_host()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format=log_format())
    config = server_config(args)
    slots = default_slots(args.device) if args.max_num_streams is None else args.max_num_streams
    try:
        check_device(args.device)
        engine = ASREngine(
            model=args.model,
            device=args.device,
            max_num_streams=slots,
            max_queue=args.max_queue,
            auto_limit=auto_limit(config, args.max_queue) if slots == "auto" else None,
            diarizer=diarizer,
            diarizer_latency=args.diarizer_latency,
            **engine_options(args),
        )
    except (PrecisionError, DeviceError, ModelNotFound, EngineError, ConvertError, UnsupportedModel) as exc:
        print(f"parakeet-serve: error: {exc}{offline_hint(args.model, exc)}", file=sys.stderr)
        return 2
    print_config(args, engine.info, engine.stats()["max_num_streams"])
    problem = memory_problem(config, engine.stats()["max_num_streams"] + args.max_queue)
    if problem:
        print(f"parakeet-serve: refusing to start: {problem}", file=sys.stderr)
        return 2
    freeze_startup_objects()
    with engine:
        try:
            if workers:
                outcome = serve_in_workers(argv if argv is not None else sys.argv[1:], workers, engine, config,
                                           announce_ready(args.host))
            else:
                outcome = trio.run(_main, engine, config)
        except Exception as exc:
            if not _bind_failed(exc):
                raise
            # a port was taken while the model loaded: look again to name it
            problem = port_problem(args.host, _ports(args)) or f"cannot listen: {_bind_failed(exc)}"
            print(f"parakeet-serve: error: {problem}", file=sys.stderr)
            return 2
    print(f"parakeet-serve stopped ({outcome})", flush=True)
    return 0


def _worker_count(args: argparse.Namespace) -> int:
    return default_workers(args.device) if args.workers == "auto" else args.workers


def temp_problem() -> str | None:
    """Worker processes reach the engine through a socket in a temporary folder: why none is writable, or None."""
    try:
        tempfile.gettempdir()
    except OSError as exc:
        return (f"worker processes need a writable temporary folder (TMPDIR or /tmp; a container with a read-only "
                f"root needs a tmpfs on /tmp) or --workers 0: {exc}")
    return None


def log_format(process: str | None = None) -> str:
    where = f" [{process}]" if process else ""
    return f"%(asctime)s %(levelname)s{where} %(name)s: %(message)s"


def _ports(args: argparse.Namespace) -> dict[str, int | None]:
    return {"--port": args.port, "--ws-port": args.ws_port, "--http-port": args.http_port,
            "--grpc-port": args.grpc_port, "--agent-port": args.agent_port}


def _bind_failed(exc: BaseException) -> OSError | None:
    """The OSError a listener raised while starting, however deep in exception groups."""
    if isinstance(exc, OSError):
        return exc
    return next((found for inner in getattr(exc, "exceptions", ()) if (found := _bind_failed(inner))), None)


def offline_hint(model: str, exc: Exception) -> str:
    """What to add to a model error: a named model the hub cannot deliver has the demo model to fall back on."""
    if getattr(exc, "unreachable", False) and model in HUB_ALIASES:
        return "; --model demo (the bundled demo model) needs no network"
    return ""


async def _main(engine: ASREngine, config: ServerConfig) -> str:
    return await run(ServerContext.create(engine, config))


if __name__ == "__main__":
    sys.exit(main())
