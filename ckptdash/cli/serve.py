"""``ckptdash demo`` and ``ckptdash serve``: their arguments and how they start the dashboard.
:mod:`ckptdash.cli` adds these commands to its parser."""

from __future__ import annotations

import argparse
import errno
import socket
from pathlib import Path
from typing import Any

from ckptdash.cli.demo import DEFAULT_STEPS
from ckptdash.errors import CkptDashError


def add_commands(sub: Any) -> None:
    """Add ``demo`` and ``serve`` to the ``ckptdash`` parser's subcommands ``sub``."""
    s = sub.add_parser(
        "demo", help="run a small real training: two preemptions, a kill, resumes (~1 min)"
    )
    s.add_argument(
        "--run-dir",
        help="where the demo writes (default runs/demo; the first free runs/demo-N once that"
        " holds a demo)",
    )
    s.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help="training steps (default %(default)s)"
    )
    s.add_argument(
        "--preempt-every",
        type=float,
        default=10.0,
        help="seconds of training before each preemption or kill (%(default)s)",
    )
    s.add_argument(
        "--max-preemptions", type=int, default=2, help="SIGUSR2 preemptions (%(default)s)"
    )
    s.add_argument(
        "--kills",
        type=int,
        default=1,
        help="then kill this many attempts without warning (SIGKILL) (%(default)s)",
    )
    s.add_argument(
        "--port",
        type=int,
        default=5006,
        help="serve the live dashboard on 127.0.0.1:PORT while it runs; 0 picks a free port"
        " (%(default)s)",
    )
    s.add_argument("--no-serve", action="store_true", help="do not serve the dashboard")
    s.add_argument(
        "--exit-when-done",
        action="store_true",
        help="end when the training ends (by default the dashboard stays up until Ctrl-C)",
    )
    s.set_defaults(func=demo_command)

    s = sub.add_parser("serve", help="serve the live dashboard (a run or a folder of runs)")
    s.add_argument("path", nargs="?", help="a run directory, or a folder of run directories")
    s.add_argument(
        "--logdir",
        metavar="PATH",
        help="the same as PATH (TensorBoard's spelling: --logdir runs/)",
    )
    s.add_argument("--port", type=int, default=5006, help="0 picks a free port (%(default)s)")
    s.add_argument(
        "--address",
        "--host",
        dest="address",
        default="127.0.0.1",
        help="listen address; --host is TensorBoard's spelling (%(default)s)",
    )
    s.add_argument(
        "--bind_all",
        action="store_true",
        help=argparse.SUPPRESS,  # TensorBoard's: refused below, naming ckptdash's flags
    )
    s.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --address (anyone reaching it can try: add TLS)",
    )
    s.add_argument(
        "--basic-auth",
        metavar="FILE",
        help="also ask for a password (Panel's login page), read from FILE (chmod 600): one"
        ' password, or {"user": "password", ...}; or set $CKPTDASH_BASIC_AUTH',
    )
    s.add_argument(
        "--token-file",
        metavar="FILE",
        help="the URL's token, from FILE (chmod 600) or $CKPTDASH_TOKEN (default: a new random"
        " token at each start)",
    )
    s.add_argument(
        "--no-auth",
        action="store_true",
        help="ask no token (every user who reaches the port can stop the job; warns at start)",
    )
    s.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another Host name the browser uses (a proxy); others get 403 (repeatable)",
    )
    s.add_argument("--certfile", metavar="PEM", help="serve https: the TLS certificate")
    s.add_argument("--keyfile", metavar="PEM", help="serve https: the certificate's private key")
    s.add_argument(
        "--origin", action="append", default=[], metavar="HOST:PORT", help="more page origins"
    )
    s.add_argument("--poll", action="store_true", help="poll instead of inotify (NFS, Lustre)")
    s.add_argument("--inotify", action="store_true", help="use inotify even on a network mount")
    s.add_argument("--poll-interval", type=float, default=1.0, help="seconds (%(default)s)")
    s.add_argument("--stale-after", type=float, default=120.0, help="seconds (%(default)s)")
    s.add_argument("--show", action="store_true", help="open a browser tab")
    s.set_defaults(func=serve_command)


def check_port_free(address: str, port: int) -> None:
    """Refuse a port another program listens on, saying which option to use. The server's own
    bind says the same (a race lost after this check)."""
    from ckptdash.dash.server_messages import port_in_use

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado binds
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CkptDashError(port_in_use(address, port)) from None
            # Anything else (a name, not an address): the server's bind reports it.


def demo_command(args: argparse.Namespace) -> int:
    """``ckptdash demo``: a small real training with preemptions, a kill and resumes."""
    from ckptdash.cli.demo import choose_run_dir, run_demo

    if not 0 <= args.port <= 65535:
        raise CkptDashError(f"--port {args.port}: must be 0 (any free port) to 65535")
    run_dir, said = choose_run_dir(None if args.run_dir is None else Path(args.run_dir))
    if said:
        print(said, flush=True)
    return run_demo(
        run_dir,
        steps=args.steps,
        preempt_every_s=args.preempt_every,
        max_preemptions=args.max_preemptions,
        kills=args.kills,
        port=None if args.no_serve else args.port,
        exit_when_done=args.exit_when_done,
    )


def serve_command(args: argparse.Namespace) -> int:
    """``ckptdash serve PATH``: the live dashboard; secrets from files or the environment."""
    if args.bind_all:
        raise CkptDashError(
            "--bind_all is TensorBoard's; ckptdash listens on every interface with"
            " --address 0.0.0.0 --allow-remote (read docs/security.md first)"
        )
    if args.path and args.logdir and args.path != args.logdir:
        raise CkptDashError(f"{args.path} and --logdir {args.logdir}: pass one run path")
    path = args.path or args.logdir
    if not path:
        raise CkptDashError(
            "serve what? pass a run directory or a folder of runs: ckptdash serve runs/"
        )
    if args.port:
        check_port_free(args.address, args.port)  # before Panel's imports: said at once
    from ckptdash.dash import access
    from ckptdash.dash.app import DashOptions
    from ckptdash.dash.server import ServeOptions, serve

    if args.poll and args.inotify:
        raise CkptDashError("--poll and --inotify: choose one (or neither: detected per mount)")
    if args.no_auth and args.token_file:
        raise CkptDashError("--no-auth and --token-file: choose one")
    # Secrets come from files only their owner can read, or the environment: never argv.
    if args.keyfile:
        access.read_secret_file(args.keyfile, "--keyfile")  # refused if others can read it
    env_token, env_password = access.environment_secrets()
    token = access.read_secret_file(args.token_file, "--token-file") if args.token_file else None
    password: str | None = env_password
    if args.basic_auth:
        password = access.read_secret_file(args.basic_auth, "--basic-auth")
    serve(
        path,
        ServeOptions(
            address=args.address,
            port=args.port,
            allow_remote=args.allow_remote,
            basic_auth=None if password is None else access.basic_auth_secret(password),
            origins=tuple(args.origin),
            show=args.show,
            token=token or env_token,
            no_auth=args.no_auth,
            allow_hosts=tuple(args.allow_host),
            certfile=args.certfile,
            keyfile=args.keyfile,
        ),
        DashOptions(
            watch="poll" if args.poll else "inotify" if args.inotify else "auto",
            poll_interval_s=args.poll_interval,
            stale_after_s=args.stale_after,
        ),
    )
    return 0
