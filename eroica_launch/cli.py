"""``eroica-run``: torchrun's command line, launched over MPI, with eroica injected into every rank.

One argparse parser, like ``torch/distributed/run.py``: the same flags in dash and underscore
spellings, the same defaults, ``PET_*`` environment defaults read the same way, and everything after
the script handed to the script. eroica's own flags follow, each with an ``EROICA_*`` default.
"""

from __future__ import annotations

import argparse
import os
import sys
from argparse import REMAINDER, Action, ArgumentParser
from dataclasses import fields

from eroica_runtime.config import Config, ConfigError, env_name, flag_fields, parse

_FIELD_HELP = {f.name: f.metadata["help"] for f in flag_fields()}

EROICA_PREFIX = "eroica-run"


class _Env(Action):
    """Default from an environment variable (PET_<DEST> like torchrun, or EROICA_<DEST>)."""

    def __init__(self, dest: str, default: object = None, required: bool = False,
                 env_var: str | None = None, **kwargs: object) -> None:
        self.env_var = env_var or f"PET_{dest.upper()}"
        default = os.environ.get(self.env_var, default)
        if default is not None and required:
            required = False
        super().__init__(dest=dest, default=default, required=required, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class _EnvFlag(Action):
    """A store_true flag whose default comes from PET_<DEST>/EROICA_<DEST> (any non-empty, non-0 value)."""

    def __init__(self, dest: str, default: bool = False, env_var: str | None = None,
                 **kwargs: object) -> None:
        self.env_var = env_var or f"PET_{dest.upper()}"
        raw = os.environ.get(self.env_var)
        if raw is not None:
            default = raw.strip().lower() not in ("", "0", "false", "no", "off")
        super().__init__(dest=dest, default=default, nargs=0, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)


def _both(name: str) -> list[str]:
    """``--nproc-per-node`` and ``--nproc_per_node``, as torchrun accepts both."""
    dash = "--" + name.replace("_", "-")
    under = "--" + name.replace("-", "_")
    return [dash] if dash == under else [dash, under]


def _eroica(parser: argparse._ArgumentGroup, name: str, help_text: str, *, flag: bool = False,
            metavar: str | None = None) -> None:
    """An eroica flag whose default is EROICA_<NAME>, falling back to Config's default."""
    default = getattr(Config(), name)
    if isinstance(default, tuple):
        default = ",".join(str(v) for v in default)
    opts = _both(name.removesuffix("_s") if name.endswith("_s") else name)
    if flag:
        parser.add_argument(*opts, action=_EnvFlag, dest=name, env_var=env_name(name), default=default,
                            help=f"{help_text.replace('%', '%%')} (env {env_name(name)})")
    else:
        shown = "" if default in ("", None) else "; default: %(default)s"
        parser.add_argument(*opts, action=_Env, dest=name, env_var=env_name(name), default=default,
                            metavar=metavar, help=f"{help_text.replace('%', '%%')} (env {env_name(name)}{shown})")


def get_parser() -> ArgumentParser:
    """The eroica-run parser: torchrun's flags first, then eroica's."""
    p = ArgumentParser(
        prog=EROICA_PREFIX,
        description="A drop-in replacement for torchrun that launches the ranks over MPI (mpiexec "
                    "locally, srun inside a Slurm allocation) and watches every rank with eroica: when "
                    "steps slow down, all ranks profile the same steps and rank 0 names the culprit.",
    )
    t = p.add_argument_group("torchrun flags (same meaning and defaults as torchrun)")
    t.add_argument("--nnodes", action=_Env, type=str, default="1:1",
                   help="Number of nodes, N or MIN:MAX. Under MPI the node count is fixed: MIN must equal "
                        "MAX (elastic ranges are refused).")
    t.add_argument(*_both("nproc_per_node"), action=_Env, dest="nproc_per_node", type=str, default="1",
                   help="Ranks per node: an int, or auto (GPUs if any, else CPU cores), cpu (CPU cores), "
                        "gpu (GPUs).")
    t.add_argument(*_both("rdzv_backend"), action=_Env, dest="rdzv_backend", type=str, default="static",
                   help="static or c10d: mapped to MPI's own rendezvous (MASTER_ADDR/PORT from "
                        "--rdzv-endpoint). etcd backends are refused.")
    t.add_argument(*_both("rdzv_endpoint"), action=_Env, dest="rdzv_endpoint", type=str, default="",
                   help="host[:port] of rank 0's store; becomes MASTER_ADDR/MASTER_PORT.")
    t.add_argument(*_both("rdzv_id"), action=_Env, dest="rdzv_id", type=str, default="none",
                   help="Job id; becomes TORCHELASTIC_RUN_ID and names the default report dir.")
    t.add_argument(*_both("rdzv_conf"), action=_Env, dest="rdzv_conf", type=str, default="",
                   help="key=value,... Only 'timeout'/'join_timeout' mean something under MPI (used as "
                        "the launch timeout); other keys are reported and ignored.")
    t.add_argument("--standalone", action=_EnvFlag, dest="standalone",
                   help="Single node: rank 0's store on localhost at a free port.")
    t.add_argument(*_both("max_restarts"), action=_Env, dest="max_restarts", type=int, default=0,
                   help="Relaunch the whole job this many times after a failure "
                        "(TORCHELASTIC_RESTART_COUNT counts up); never after a stop signal "
                        "(--signals-to-handle) sent to eroica-run.")
    t.add_argument(*_both("monitor_interval"), action=_Env, dest="monitor_interval", type=float, default=0.1,
                   help="Seconds between checks of the launched processes.")
    t.add_argument(*_both("start_method"), action=_Env, dest="start_method", type=str, default="spawn",
                   choices=["spawn", "fork", "forkserver"],
                   help="Accepted for parity; the MPI launcher always starts fresh processes (like spawn).")
    t.add_argument(*_both("event_log_handler"), action=_Env, dest="event_log_handler", type=str,
                   default="null", help="Accepted for parity; eroica keeps its own report directory.")
    t.add_argument("--role", action=_Env, type=str, default="default", help="ROLE_NAME of the ranks.")
    t.add_argument("-m", "--module", action=_EnvFlag, dest="module",
                   help="Run the script as a module (python -m).")
    t.add_argument(*_both("no_python"), action=_EnvFlag, dest="no_python",
                   help="Run the script as an executable, not through python.")
    t.add_argument(*_both("run_path"), action=_EnvFlag, dest="run_path",
                   help="Run the script with runpy.run_path in the rank process.")
    t.add_argument(*_both("log_dir"), action=_Env, dest="log_dir", type=str, default=None,
                   help="Directory for per-rank stdout/stderr files (attempt_<n>/<rank>/stdout.log).")
    t.add_argument("-r", "--redirects", action=_Env, dest="redirects", type=str, default="0",
                   help="Redirect streams to files in --log-dir: 0 none, 1 stdout, 2 stderr, 3 both; "
                        "or per local rank, e.g. 0:1,1:2.")
    t.add_argument("-t", "--tee", action=_Env, dest="tee", type=str, default="0",
                   help="Like --redirects, but also keep printing to the console.")
    t.add_argument(*_both("local_ranks_filter"), action=_Env, dest="local_ranks_filter", type=str,
                   default="", help="Only show these local ranks' output on the console, e.g. 0,3.")
    t.add_argument(*_both("node_rank"), action=_Env, dest="node_rank", type=int, default=0,
                   help="This node's rank. Under MPI one eroica-run starts every node, so only 0 is "
                        "accepted outside Slurm.")
    t.add_argument(*_both("master_addr"), action=_Env, dest="master_addr", type=str, default="127.0.0.1",
                   help="Address of rank 0's node (multi-node: default is the first host of the "
                        "allocation or hostfile).")
    t.add_argument(*_both("master_port"), action=_Env, dest="master_port", type=int, default=None,
                   help="Port of rank 0's store (default: on one node a free port below the ephemeral "
                        "range; under Slurm one derived from the job id; 29500 otherwise).")
    t.add_argument(*_both("local_addr"), action=_Env, dest="local_addr", type=str, default=None,
                   help="This node's address; used as MASTER_ADDR on a single node.")
    t.add_argument(*_both("logs_specs"), action=_Env, dest="logs_specs", type=str, default=None,
                   help="Refused: custom LogsSpecs plug-ins do not apply under MPI; use --log-dir.")
    t.add_argument(*_both("numa_binding"), action=_Env, dest="numa_binding", type=str, default=None,
                   help="Refused: bind with your MPI launcher's options instead (EROICA_MPIEXEC_ARGS).")
    t.add_argument(*_both("signals_to_handle"), action=_Env, dest="signals_to_handle", type=str,
                   default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                   help="Signals forwarded to every rank (SIGUSR1/SIGUSR2 are always forwarded).")
    t.add_argument(*_both("shutdown_timeout"), action=_Env, dest="shutdown_timeout", type=int, default=None,
                   help="Seconds between SIGTERM and SIGKILL when the job is stopped (default 30).")
    t.add_argument(*_both("virtual_local_rank"), action=_EnvFlag, dest="virtual_local_rank",
                   help="Give every rank LOCAL_RANK=0 and only its own device in CUDA_VISIBLE_DEVICES.")
    t.add_argument(*_both("duplicate_stdout_filters"), action=_Env, dest="duplicate_stdout_filters",
                   type=str, default="", help="Accepted for parity; ignored with a note when set.")
    t.add_argument(*_both("duplicate_stderr_filters"), action=_Env, dest="duplicate_stderr_filters",
                   type=str, default="", help="Accepted for parity; ignored with a note when set.")

    e = p.add_argument_group("eroica flags")
    _eroica(e, "report_dir", _FIELD_HELP["report_dir"], metavar="DIR")
    e.add_argument("--launcher", action=_Env, env_var="EROICA_LAUNCHER", default="auto",
                   choices=["auto", "mpiexec", "srun", "inplace"],
                   help="How ranks are started: auto = in place when already an MPI/Slurm task, srun "
                        "inside a Slurm allocation, else mpiexec (env EROICA_LAUNCHER).")
    e.add_argument("--hostfile", action=_Env, env_var="EROICA_HOSTFILE", default=None,
                   help="mpiexec hostfile for multi-node runs without Slurm (env EROICA_HOSTFILE).")
    e.add_argument("--mpiexec-args", action=_Env, env_var="EROICA_MPIEXEC_ARGS", default="",
                   help="Extra arguments for mpiexec/srun, shell-quoted (env EROICA_MPIEXEC_ARGS).")
    e.add_argument("--no-eroica", action=_EnvFlag, dest="no_eroica", env_var="EROICA_DISABLE",
                   help="Launch without the runtime (plain torchrun behaviour over MPI) (env EROICA_DISABLE).")
    e.add_argument("--no-prefix", action=_EnvFlag, dest="no_prefix", env_var="EROICA_NO_PREFIX",
                   help="Do not prefix rank output with [rankN]: (env EROICA_NO_PREFIX).")
    for f in flag_fields():
        if f.name != "report_dir":
            _eroica(e, f.name, f.metadata["help"], metavar=f.metadata["metavar"])
    e.add_argument("--no-baseline", action=_EnvFlag, dest="no_baseline", env_var="EROICA_NO_BASELINE",
                   help="Skip the automatic healthy-reference capture after warm-up (env EROICA_NO_BASELINE).")

    p.add_argument("training_script", type=str,
                   help="The training program (a script, a module with -m, or an executable with "
                        "--no-python), followed by its own arguments.")
    p.add_argument("training_script_args", nargs=REMAINDER)
    return p


def script_at(parser: ArgumentParser, argv: list[str]) -> int | None:
    """The index of the training script in ``argv`` (None: there is none): the first token that is
    neither an option nor an option's value.

    Why: argparse reads every token for an option, the script's own too, and stops at one that
    abbreviates two of its options. A script flag like ``--warmup 500`` (eroica's --warmup-steps
    and --warmup_steps) or ``--keep`` stopped eroica-run with "ambiguous option", where torchrun,
    which has neither, hands it to the script. So only the tokens up to the script are parsed; an
    option before it may still be abbreviated, as under torchrun."""
    actions = parser._option_string_actions
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return i + 1 if i + 1 < len(argv) else None
        if not token.startswith("-") or token == "-":
            return i
        name, eq, _ = token.partition("=")
        action = actions.get(name)
        if action is None and name.startswith("--"):
            found = {id(a): a for s, a in actions.items() if s.startswith(name)}
            action = next(iter(found.values())) if len(found) == 1 else None
        i += 2 if action is not None and action.nargs != 0 and not eq else 1
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse; also note which flags were spelled out (argparse cannot tell a default from a value).
    Everything after the training script is the script's, untouched (``script_at``)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = get_parser()
    at = script_at(parser, argv)
    args = parser.parse_args(argv if at is None else argv[:at + 1])   # None: argparse says what is missing
    args.training_script_args = argv[at + 1:] if at is not None else []
    given = set()
    for token in argv[:at]:
        if token.startswith("--") and token != "--":
            given.add(token[2:].split("=", 1)[0].replace("-", "_"))
    args._given = given
    return args


def config_from_args(args: argparse.Namespace) -> Config:
    """eroica's Config from the parsed flags (which already folded in EROICA_* defaults).

    Values go through the same parser and checks as the EROICA_* variables, so a bad flag gets one
    line naming it (``--deadline (EROICA_DEADLINE_S)='abc': expected a number``).
    """
    values: dict[str, object] = {}
    # settings that are no flag (EROICA_VOTE_LAG, EROICA_LOG_LEVEL, EROICA_KEEP_RAW_EVENTS...) come from
    # the environment as they are: the ranks get the whole Config back as variables, defaults included
    for f in fields(Config):
        var = env_name(f.name)
        if not f.metadata.get("help") and os.environ.get(var):
            values[f.name] = parse(f.name, os.environ[var])
    for f in flag_fields():
        raw = getattr(args, f.name)
        if raw is None:
            continue
        values[f.name] = raw if not isinstance(raw, str) else parse(f.name, raw)
    values["enabled"] = not args.no_eroica
    values["baseline"] = not args.no_baseline
    cfg = Config(**values)  # type: ignore[arg-type]
    cfg.check()
    return cfg


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``eroica-run``: parse, plan, launch, supervise, exit like torchrun."""
    from eroica_launch.plan import LaunchError, plan_launch
    from eroica_launch.supervise import run_plan
    from eroica_runtime.reportdir import ensure_directory

    args = parse_args(argv)
    try:
        cfg = config_from_args(args)
        plan = plan_launch(args, cfg)
    except (LaunchError, ConfigError, ValueError) as exc:
        print(f"{EROICA_PREFIX}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if not (args.module or args.no_python) and not os.path.isfile(args.training_script):
        print(f"{EROICA_PREFIX}: error: {args.training_script}: no such training script", file=sys.stderr)
        sys.exit(2)
    if cfg.enabled or plan.mode != "inplace":
        try:   # every rank's status (and rank 0's reports) go here: fail now, in one line, not per rank
            ensure_directory(plan.report_dir)
        except OSError as exc:
            print(f"{EROICA_PREFIX}: error: --report-dir {plan.report_dir}: {exc.strerror or exc}", file=sys.stderr)
            sys.exit(2)
    sys.exit(run_plan(plan))


if __name__ == "__main__":
    main()
