"""A runc wrapper: fixes what runc is asked for that this machine cannot give, then execs runc.

It is registered as dockerd's default runtime on a host whose capability bounding set lacks some
capabilities (`--privileged` asks for all of them), and is containerd's runc `BinaryName` inside the
kind node image (where the kubelet also asks for a negative oom_score_adj nobody here may set).

- `create` / `run`: edits the OCI bundle's config.json (`--bundle`, default the working directory);
- `exec`: edits the process file (`--process`), because kind does all its node work through
  `docker exec --privileged`;
- removes exactly the capabilities in DROP from every capability list, and with CLAMP_OOM raises a
  negative `oomScoreAdj` to 0;
- then replaces itself with the real runc, same arguments.

This file is standalone (standard library only, Python >= 3.9): the harness writes it out with a
shebang and the three settings appended (`render()` in harness.backends.kindhost.wrapper_file).
"""

import json
import os
import sys

CAPABILITY_SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")
# runc's global options that take a value (everything else before the command is a boolean flag).
GLOBAL_VALUE_OPTIONS = ("root", "log", "log-format", "criu", "rootless")


def _option(args, names):
    """The value of the first option in `names` (`--x v`, `--x=v`, `-x v`), or None."""
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for option in names:
            for dash in ("-", "--"):
                flag = dash + option
                if arg == flag and i + 1 < len(args):
                    return args[i + 1]
                if arg.startswith(flag + "="):
                    return arg[len(flag) + 1:]
    return None


def split_command(argv):
    """(command, its arguments) after runc's global options; (None, []) when there is none."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            return arg, argv[i + 1:]
        bare = arg.lstrip("-")
        i += 2 if bare in GLOBAL_VALUE_OPTIONS else 1
    return None, []


def target_file(argv):
    """The JSON file runc will read for this call that may need fixing, or None."""
    command, args = split_command(argv)
    if command in ("create", "run"):
        return os.path.join(_option(args, ("bundle", "b")) or ".", "config.json")
    if command == "exec":
        return _option(args, ("process", "p"))
    return None


def fix_process(process, drop, clamp_oom):
    """Apply the fixes to an OCI `process` object in place; True when something changed."""
    changed = False
    capabilities = process.get("capabilities")
    if isinstance(capabilities, dict):
        for key in CAPABILITY_SETS:
            values = capabilities.get(key)
            if isinstance(values, list):
                kept = [cap for cap in values if cap not in drop]
                if len(kept) != len(values):
                    capabilities[key] = kept
                    changed = True
    adj = process.get("oomScoreAdj")
    if clamp_oom and isinstance(adj, int) and adj < 0:
        process["oomScoreAdj"] = 0
        changed = True
    return changed


def fix_file(path, is_bundle_config, drop, clamp_oom):
    with open(path) as handle:
        document = json.load(handle)
    process = document.get("process") if is_bundle_config else document
    if not isinstance(process, dict) or not fix_process(process, drop, clamp_oom):
        return
    tmp = path + ".dra-harness-tmp"
    with open(tmp, "w") as handle:
        json.dump(document, handle)
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
    os.replace(tmp, path)


def main(argv, runc, drop, clamp_oom):
    path = target_file(argv)
    if path is not None and os.path.isfile(path):
        command, _ = split_command(argv)
        try:
            fix_file(path, command != "exec", drop, clamp_oom)
        except (OSError, ValueError) as err:
            sys.stderr.write("runc wrapper (dra-harness): cannot fix %s: %s\n" % (path, err))
            return 1
    os.execv(runc, [runc] + list(argv))
