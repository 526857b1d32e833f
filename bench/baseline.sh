# bench/baseline.sh -- the hand-written baseline: ONE `ssh host sh -s` per host.
#
# bench/run.py sends this script on the ssh session's stdin, with the VARS
# placeholder line replaced by shell-quoted assignments for that host (SP, LOG,
# PIDFILE, WORKDIR, MARKER, TIMEOUT, GRACE, START, CHANGED) and the DIFF
# placeholder line by the unified diff. It
# applies the same diff fleetpatch applies, with a backup, restarts the server
# the way the inventory's `command` restart does, and follows the log written
# since the restart until the marker of the path that host runs appears.
# Exit 0 = marker seen. Everything happens in one round trip.
set -eu
@VARS@

# 1. apply, with a backup (*.orig beside each file); exact context, no fuzz
cd "$SP"
patch -b -p1 -F0 --forward --batch --silent <<'FLEETPATCH_BENCH_DIFF_EOF'
@DIFF@
FLEETPATCH_BENCH_DIFF_EOF

# 2. remove stale bytecode of the changed modules
for f in $CHANGED; do
    d=${f%/*}; b=${f##*/}; b=${b%.py}
    rm -f "$d/__pycache__/$b".*.pyc
done

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
timeout "$TIMEOUT" sh -c '
    tail -c +"$((OFFSET + 1))" -F -- "$LOG" 2>/dev/null | {
        grep -m1 -F -- "$MARKER"; rc=$?
        pkill -P $$ -x tail 2>/dev/null
        exit $rc
    }'
