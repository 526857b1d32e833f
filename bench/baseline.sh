# bench/baseline.sh -- the hand-written baseline: ONE `ssh host sh -s` per host.
#
# bench/run.py sends this script on the ssh session's stdin, with the VARS
# placeholder line replaced by shell-quoted assignments for that host (SP, LOG,
# PIDFILE, WORKDIR, MARKER, TIMEOUT, GRACE, START, CHANGED, CHECKS; with
# CHECKS=1 also READY, HEALTH_URL, GENERATE_URL, SMOKE) and the DIFF
# placeholder line by the unified diff. It
# applies the same diff fleetpatch applies, with a backup, restarts the server
# the way the inventory's `command` restart does, and follows the log written
# since the restart until the marker of the path that host runs appears.
# Exit 0 = marker seen. Everything happens in one round trip.
#
# CONTAINER=NAME (a container host: the engine is the main process of that Docker
# container, its log the container's output): the same job the way a hand-written
# script does it there, still one ssh. The files are patched inside the container
# through /proc/<its main pid>/root (SP is the path inside it), `docker restart`
# stops and starts it, and `docker logs --since <the restart> --follow` is followed
# until the marker. CHECKS=1 is not offered there.
#
# CHECKS=1 (the tool baseline-checks): the checks fleetpatch makes after a
# restart before its verdict, done here too: the same follow waits for the
# marker AND the server's ready line, then /health is polled with curl until it
# answers 200 (follow and health together within TIMEOUT), then one smoke
# request (POST SMOKE to GENERATE_URL) must answer HTTP 200 with a non-empty
# "text". Still one ssh, one round trip.
set -eu
@VARS@

# 1. apply, with a backup (*.orig beside each file); exact context, no fuzz
ROOT=
if [ -n "$CONTAINER" ]; then
    [ "$CHECKS" != 1 ] || { echo "CHECKS=1 is not offered on a container host" >&2; exit 2; }
    ROOT=/proc/$(docker inspect -f '{{.State.Pid}}' -- "$CONTAINER")/root
fi
cd "$ROOT$SP"
patch -b -p1 -F0 --forward --batch --silent <<'FLEETPATCH_BENCH_DIFF_EOF'
@DIFF@
FLEETPATCH_BENCH_DIFF_EOF

# 2. remove stale bytecode of the changed modules
for f in $CHANGED; do
    d=${f%/*}; b=${f##*/}; b=${b%.py}
    rm -f "$d/__pycache__/$b".*.pyc
done

# 3-6 on a container host: restart the container, follow its output since then
if [ -n "$CONTAINER" ]; then
    SINCE=$(date +%s.%N)
    docker restart -t "$GRACE" -- "$CONTAINER" >/dev/null
    export CONTAINER MARKER SINCE
    timeout "$TIMEOUT" sh -c '
        docker logs --since "$SINCE" --follow -- "$CONTAINER" 2>&1 | {
            grep -m1 -F -- "$MARKER"; rc=$?
            pkill -P $$ -x docker 2>/dev/null
            exit $rc
        }'
    exit 0
fi

# 3. stop: TERM the pid in the pidfile, wait, KILL after the grace period.
#    A zombie counts as gone (the test fleet's first server is a child of the
#    benchmark process, which reaps it late; fleetpatch's agent does the same).
alive() {
    [ -r "/proc/$1/stat" ] || return 1
    read -r st < "/proc/$1/stat" || return 1
    st=${st##*) }; st=${st%% *}
    [ "$st" != Z ] && [ "$st" != X ]
}
if [ -s "$PIDFILE" ]; then
    read -r pid < "$PIDFILE" || pid=
    if [ -n "$pid" ] && alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        n=0
        while alive "$pid"; do
            n=$((n + 1))
            if [ "$n" -gt $((GRACE * 50)) ]; then kill -KILL "$pid" 2>/dev/null || true; fi
            sleep 0.02
        done
    fi
fi

# 4. where the log ends now: only what the new server writes counts
OFFSET=$(stat -c %s "$LOG" 2>/dev/null || echo 0)

# 5. start: own session, restart env, workdir, stdout+stderr appended to the log,
#    pid to the pidfile (the subshell execs env -> setsid -> python: same pid)
( cd "$WORKDIR" && eval "exec $START" ) >>"$LOG" 2>&1 </dev/null &
echo $! > "$PIDFILE"

# 6. follow the log from the restart offset until the marker (or the timeout)
export LOG MARKER OFFSET
if [ "$CHECKS" != 1 ]; then
    timeout "$TIMEOUT" sh -c '
        tail -c +"$((OFFSET + 1))" -F -- "$LOG" 2>/dev/null | {
            grep -m1 -F -- "$MARKER"; rc=$?
            pkill -P $$ -x tail 2>/dev/null
            exit $rc
        }'
    exit 0   # (set -e: a timeout or a missing marker has already exited with its status)
fi

# 7. (CHECKS=1) the same follow until both the marker and the ready line are in
#    the new log (either order; grep passes on only those lines, line by line,
#    and the last stage stops tail once it has both), then /health until 200;
#    both within TIMEOUT
export READY HEALTH_URL
timeout "$TIMEOUT" sh -c '
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

# 8. (CHECKS=1) one smoke request: HTTP 200 and a non-empty "text" in the answer
NL='
'
ANSWER=$(curl -sS --max-time "$TIMEOUT" -H 'Content-Type: application/json' --data-binary "$SMOKE" \
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
