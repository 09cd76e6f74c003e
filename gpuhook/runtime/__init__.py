"""gpuhook-runtime: an OCI runtime with runc's command line that edits config.json at create.

containerd's io.containerd.runc.v2 shim (options.BinaryName) and CRI-O (runtime_path) call
it exactly as they call runc. The C front (bin/gpuhook-runtime, gpuhook-runtime.c) execs the
real runtime itself for every subcommand but create/run, and for create/run on a node with no
GPU node at all, so Python starts only when there may be something to inject, or for an exec
into a container gpuhook injected. It asks the node's runtime server first (server.py: this
same path in a warm interpreter) when one listens. The steps, one module each:

    args.py    the invocation: runc's command line (parse_args), the call's inputs (Call)
               and what it comes to (Answer)
    create.py  create/run: read <bundle>/config.json -> probe -> plan -> apply -> write it
               atomically -> the exec record -> one JSON log line
    exec.py    exec: the env recorded at create into the exec'd process (records swept at create)
    server.py  the resident runtime server

Here only the dispatch (prepare) and the fresh interpreter's entry (main): a call is an
args.Call in, an args.Answer out, and nothing in between changes the process it runs in.
Nothing is ever printed on stdout, which belongs to the real runtime.
"""

import os
import sys

from .args import EDITING_COMMANDS, Answer, Call, parse_args


def prepare(argv: list[str], call: Call) -> Answer:
    """Everything before the real runtime runs, for this call: the Answer says what to exec
    (its argv[0] the runtime's path) or the status to exit with (no runtime, fail_mode
    closed), the text for stderr and the log line. Run by main()
    and, for a node's resident server, by server.py."""
    from ..config import DEFAULT_RUNTIMES, config_path, find_runtime, is_front, load
    from .logline import NO_RUNTIME, NO_RUNTIME_STATUS, RUNTIME_IS_FRONT, runtime_error

    inv = parse_args(argv, call.cwd)
    config, config_errors = load()
    call.stage("config")
    real = find_runtime(config.runtime, call.env.get("PATH", ""), call.cwd)
    if real is None:
        msg = NO_RUNTIME % (config.runtime or " or ".join(DEFAULT_RUNTIMES), config_path())
        return Answer(status=NO_RUNTIME_STATUS, said=runtime_error(inv, call, msg))
    if is_front(real):
        msg = RUNTIME_IS_FRONT % (real, config_path())
        return Answer(status=NO_RUNTIME_STATUS, said=runtime_error(inv, call, msg))
    if inv.command in EDITING_COMMANDS:
        from .create import create_call

        return create_call(inv, argv, real, config, config_errors, call)
    if inv.command == "exec":
        from .exec import exec_call

        return exec_call(inv, argv, real, config, call)
    return Answer([real] + argv)  # delete too: the runtime's alone (exec.sweep at create)


def main(argv: list[str] | None = None) -> None:
    """The fresh interpreter's call: its log line and stderr text written, then the real
    runtime exec'd (or the exit)."""
    from .logline import CANNOT_RUN, NO_RUNTIME_STATUS, runtime_error, write_log

    call = Call.here()
    args = list(sys.argv[1:] if argv is None else argv)
    answer = prepare(args, call)
    write_log(answer.log)
    if answer.said:
        sys.stderr.write(answer.said)
        sys.stderr.flush()
    if answer.argv is None:
        sys.exit(answer.status)
    try:
        os.execv(answer.argv[0], answer.argv)
    except OSError as e:  # e.g. a script whose interpreter is missing, a noexec mount
        msg = CANNOT_RUN % (answer.argv[0], e.strerror or e)
        sys.stderr.write(runtime_error(parse_args(args, call.cwd), call, msg))
        sys.exit(NO_RUNTIME_STATUS)
