# bench/pyinfra_deploy.py -- the pyinfra 3.x equivalent of a fleetpatch rollout,
# builtin operations only. bench/run.py writes the inventory (a Python file with
# one (name, data) tuple per host: connection data and the fp_* values below) and
# runs `pyinfra -y --parallel N inventory.py bench/pyinfra_deploy.py`.
#
# Per-host data:
#   fp_diff           the diff on the controller
#   fp_remote_diff    where it is put on the host
#   fp_site_packages  the directory holding sglang/ on the host (has a space)
#   fp_changed        the changed files, relative to fp_site_packages
#   fp_pidfile, fp_log, fp_workdir, fp_grace
#   fp_start          the inventory's start command with its env, shell-quoted
#   fp_marker         the marker of the code path this host runs
#   fp_offset_file    where the restart notes the log size, for the wait
#   fp_temp_dir       a directory on the host for pyinfra's temp files
#   fp_checks         True for the tool pyinfra-checks: the follow also does the checks
#                     fleetpatch makes after a restart (below); then also
#   fp_ready, fp_health_url, fp_generate_url, fp_smoke
#                     the ready line, the host's health URL, its /generate URL and
#                     the smoke request's JSON body
#
# Three operations, each one barrier across the hosts (pyinfra runs an operation
# on every host, in parallel, before the next): put the diff; apply it with a
# backup, drop the bytecode and restart (one shell: nothing in between needs the
# controller); follow the log from the restart offset until the marker.
import shlex

from pyinfra import host
from pyinfra.operations import files, server

d = host.data
q = shlex.quote

# Tuned for the fewest round trips: the home directory exists (no remote-dir
# check), the diff is no secret (no chmod after the upload), and an explicit temp
# dir spares the $TMPDIR probe. What is left: two file facts and the scp upload.
files.put(
    name="put the diff",
    src=d.fp_diff,
    dest=d.fp_remote_diff,
    create_remote_dir=False,
    _temp_dir=d.fp_temp_dir,
)

server.shell(
    name="apply with a backup (GNU patch, exact context), drop stale bytecode, restart like the inventory",
    commands=[f"""set -eu
cd {q(d.fp_site_packages)}
patch -b -p1 -F0 --forward --batch --silent -i {q(d.fp_remote_diff)}
for f in {' '.join(q(f) for f in d.fp_changed)}; do
    dd=${{f%/*}}; b=${{f##*/}}; b=${{b%.py}}
    rm -f "$dd/__pycache__/$b".*.pyc
done
alive() {{
    [ -r "/proc/$1/stat" ] || return 1
    read -r st < "/proc/$1/stat" || return 1
    st=${{st##*) }}; st=${{st%% *}}
    [ "$st" != Z ] && [ "$st" != X ]
}}
PIDFILE={q(d.fp_pidfile)}
if [ -s "$PIDFILE" ]; then
    read -r pid < "$PIDFILE" || pid=
    if [ -n "$pid" ] && alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        n=0
        while alive "$pid"; do
            n=$((n + 1))
            if [ "$n" -gt $(({d.fp_grace} * 50)) ]; then kill -KILL "$pid" 2>/dev/null || true; fi
            sleep 0.02
        done
    fi
fi
stat -c %s {q(d.fp_log)} > {q(d.fp_offset_file)} 2>/dev/null || echo 0 > {q(d.fp_offset_file)}
( cd {q(d.fp_workdir)} && exec {d.fp_start} ) >>{q(d.fp_log)} 2>&1 </dev/null &
echo $! > "$PIDFILE"
"""],
)

FOLLOW = f"""read -r OFFSET < {q(d.fp_offset_file)}
export OFFSET
LOG={q(d.fp_log)} MARKER={q(d.fp_marker)} timeout 60 sh -c '
    tail -c +"$((OFFSET + 1))" -F -- "$LOG" 2>/dev/null | {{
        grep -m1 -F -- "$MARKER"; rc=$?
        pkill -P $$ -x tail 2>/dev/null
        exit $rc
    }}'
"""

# pyinfra-checks: the same operation's shell, doing after the marker what fleetpatch does before
# its verdict: the marker AND the server's ready line in the log written since the restart (one
# follow), /health polled with curl until 200 (follow and health within the same 60 s), then one
# smoke request that must answer HTTP 200 with a non-empty "text" (as bench/baseline.sh, CHECKS=1).
FOLLOW_AND_CHECK = f"""set -eu
read -r OFFSET < {q(d.fp_offset_file)}
LOG={q(d.fp_log)} MARKER={q(d.fp_marker)} READY={q(d.fp_ready or "")}
HEALTH_URL={q(d.fp_health_url or "")} GENERATE_URL={q(d.fp_generate_url or "")} SMOKE={q(d.fp_smoke or "")}
export OFFSET LOG MARKER READY HEALTH_URL
""" + r"""timeout 60 sh -c '
    tail -c +"$((OFFSET + 1))" -F -- "$LOG" 2>/dev/null |
    grep --line-buffered -F -e "$MARKER" -e "$READY" | {
        m= r= rc=1
        while IFS= read -r line; do
            case $line in *"$MARKER"*) m=1; printf "%s\n" "$line" ;; esac
            case $line in *"$READY"*) r=1 ;; esac
            if [ -n "$m" ] && [ -n "$r" ]; then rc=0; break; fi
        done
        pkill -P $$ -x tail 2>/dev/null
        exit $rc
    } || exit
    until [ "$(curl -s -o /dev/null -w "%{http_code}" --max-time 2 -- "$HEALTH_URL")" = 200 ]; do
        sleep 0.02
    done'
NL='
'
ANSWER=$(curl -sS --max-time 60 -H 'Content-Type: application/json' --data-binary "$SMOKE" \
         -w '\n%{http_code}' -- "$GENERATE_URL") || { echo "smoke request to $GENERATE_URL failed" >&2; exit 1; }
CODE=${ANSWER##*"$NL"}
BODY=${ANSWER%"$NL"*}
if [ "$CODE" != 200 ]; then
    echo "smoke request to $GENERATE_URL: HTTP $CODE: $BODY" >&2
    exit 1
fi
printf '%s' "$BODY" | grep -Eq '"text"[[:space:]]*:[[:space:]]*"([^"\\]|\\.)' || {
    echo "smoke request to $GENERATE_URL: no non-empty \"text\" in the answer: $BODY" >&2
    exit 1
}
"""

server.shell(
    name=("follow the log written since the restart until the marker of the path this host runs"
          + (", the ready line; then /health until 200 and one smoke request" if d.fp_checks else "")),
    commands=[FOLLOW_AND_CHECK if d.fp_checks else FOLLOW],
)
