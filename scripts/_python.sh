# Sourced (not run) by the scripts in this directory: which Python runs faultnet.
#
#   . "$root/scripts/_python.sh"; py="$(faultnet_python "$root" SCRIPT)" || exit 2
#   . "$root/scripts/_python.sh"; faultnet_exec "$root" SCRIPT -m MODULE ARGS...
#
# A plain script has no record of the interpreter faultnet was installed with (a console
# script's shebang has one; these are not installed), and `python3` from PATH is often
# not it: Debian's own python3 has no trio (every script failed there, while CI passed
# because its python3 happened to have trio). So the first of these that finds faultnet
# and trio (found, not imported: importing trio costs far more), with the checkout on
# PYTHONPATH as the scripts run it:
#   $PYTHON                  named by the user: taken as given, not probed
#   $VIRTUAL_ENV/bin/python  the active virtual environment (the README's commands)
#   ROOT/.venv/bin/python    the checkout's own, which the README makes when none is active
#   python3, python          from PATH (a system Python with the packages installed)
# None: one line on stderr saying what to do, and status 2 (an environment error).
# Probing costs one interpreter start per candidate tried (0.23-0.64 s each here at a
# load of ~8 on two CPUs; importing trio as well took 0.94-1.94 s).

faultnet_python() {  # faultnet_python ROOT SCRIPT_NAME
    if [ -n "${PYTHON:-}" ]; then
        printf '%s\n' "$PYTHON"
        return 0
    fi
    for _fp_cand in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$1/.venv/bin/python" python3 python; do
        if PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" "$_fp_cand" -c \
            'import importlib.util as u, sys; sys.exit(not (u.find_spec("trio") and u.find_spec("faultnet")))' \
            >/dev/null 2>&1; then
            printf '%s\n' "$_fp_cand"
            return 0
        fi
    done
    echo "$2: error: no Python here can import faultnet and trio: activate the virtual" \
        "environment faultnet is installed in, make $1/.venv (see the README)," \
        "or set PYTHON=/path/to/python" >&2
    return 2
}

faultnet_exec() {  # faultnet_exec ROOT SCRIPT_NAME PYTHON_ARGS...: run them in its place
    _fe_root="$1" _fe_script="$2"
    shift 2
    _fe_py="$(faultnet_python "$_fe_root" "$_fe_script")" || exit 2
    PYTHONPATH="$_fe_root${PYTHONPATH:+:$PYTHONPATH}" exec "$_fe_py" "$@"
}
