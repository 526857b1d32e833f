"""One `follow`: the server's log since the restart, its liveness and its health,
streamed to the laptop until it sends its decision or the time is up."""
import json
import os
import sys
import time

from .apikey import known_key, start_keys
from .base import redact
from .http import http_get
from .logs import LogFollower, LogWatch, StreamWake, open_follower
from .probing import RecordReader
from .procs import PidWatch, proc_launch
from .restart import server_pid
from .smoke import SmokeRequests
from .state import RequestReader


class Follow(object):
    """One `follow`: stream the log since the restart with liveness and health,
    until the laptop sends its follow-up requests (it has its verdict) or the
    timeout passes. Deadlines use the monotonic clock."""

    POLL_S = 0.05
    # With the log watched (inotify) its writes wake the follow at once; the timer then only
    # catches what writes nothing (a health answer, a death without a word), so it can be
    # slower: at 50 ms it was most of a follow's iterations, and of its CPU, on a busy host.
    WATCHED_POLL_S = 0.25
    DECISION_WAIT_S = 10.0
    SMOKE_AFTER_DEATH_S = 2.0

    def __init__(self, state, req):
        self.state = state
        self.req = req
        self.follower = open_follower(req)
        self.watch = self.wake_for(self.follower)
        restart = req.get("restart") or {}
        self.managed = restart.get("kind") in ("systemd", "supervisor", "container")
        self.pid = req.get("pid") or (server_pid(restart) if self.managed else None)
        self.liveness = PidWatch(self.pid) if self.pid else None
        self.health_url = req.get("health_url")
        self.info_url = req.get("server_info_url")
        self.ready_text = req.get("ready_line")
        self.env_prefixes = req.get("launch_env_prefixes") or ()
        self.api_key_env = req.get("api_key_env")
        self.found_key = None   # the server's API key (apikey.ServerKey), read from /proc at the first request
        state.secrets.update(start_keys(restart, self.api_key_env))
        self.records = RecordReader(req) if req.get("probe") else None
        self.records_watched = {}   # records dir -> its watch descriptor
        # sent once the server is ready and healthy: the verdict comes after their answers
        self.smoke = SmokeRequests(req["smoke"], self.server_key, self.api_key_env) if req.get("smoke") else None
        self.next_records = 0.0
        self.started = time.monotonic()
        self.deadline = self.started + float(req.get("timeout", 60)) + 5
        self.ready = False
        self.ready_epoch = None   # when this follow saw the ready line (time.time(): the host's clock)
        self.info_sent = False
        self.launch_sent = False
        self.last_state = None
        self.last_emit = self.started
        self.next_health = 0.0
        # The session's request stream (the laptop's decision arrives on it), or stdin when run alone.
        self.requests = state.requests or RequestReader(sys.stdin.fileno())

    @staticmethod
    def wake_for(follower):
        """What wakes the follow when the log has output: inotify on a log file, the stream's
        descriptor where the follower reads one (a container's); None: it polls."""
        if isinstance(follower, LogFollower):
            return LogWatch(follower.path)
        if getattr(follower, "wake_fd", None) is not None:
            return StreamWake(follower)
        return None

    def run(self):
        while True:
            self.send_launch()
            self.send_lines()
            now = time.monotonic()
            # a manager that reports no main process means the server is not running
            alive = self.liveness.alive() if self.pid else (False if self.managed else None)
            if alive is False:
                # What a dying server wrote last (its traceback) must reach the verdict before its death does,
                # and so must the smoke requests it died serving (their connections end with it).
                self.send_lines()
                if self.smoke is not None and self.smoke.thread is not None:
                    self.smoke.thread.join(self.SMOKE_AFTER_DEATH_S)
                    self.send_smoke(None)
            healthy = self.check_health(now, alive)
            self.send_state(now, alive, healthy)
            self.send_smoke(healthy)
            # after the smoke requests are on their way: the verdict waits for their answers, not for this
            self.send_server_info(healthy)
            self.send_records(now)
            if now > self.deadline:
                return self.at_deadline()
            followups = self.read_followups()
            if followups is not None:
                return followups

    def at_deadline(self):
        """Say the time is up, then wait a bounded moment for the laptop's decision on it
        (its record and its release of the lock), which it sends when it sees this."""
        self.state.emit({"t": "deadline"})
        until = time.monotonic() + self.DECISION_WAIT_S
        while time.monotonic() < until:
            followups = self.read_followups()
            if followups is not None:
                return dict(followups, ended="deadline") if "requests" in followups else followups
        return {"ended": "deadline"}

    def send_launch(self):
        if self.pid and not self.launch_sent and self.liveness.alive():
            # its API key first: from here on no line this session writes carries it (its log's ServerArgs do)
            self.server_key()
            # How the server that is running now was launched: it, not the inventory, decides the path.
            self.state.emit(dict(proc_launch(self.pid, self.env_prefixes), t="launch", pid=self.pid))
            self.launch_sent = True

    def send_lines(self):
        for path, first, lines in self.follower.read():
            self.state.emit({"t": "lines", "file": path, "first_line_no": first, "lines": lines,
                             "bytes_read": getattr(self.follower, "bytes_read", None)})
            self.last_emit = time.monotonic()
            if self.ready_text and not self.ready and any(self.ready_text in l for l in lines):
                self.ready = True
                self.next_health = 0.0
                # host clock, as the probe's records are: what ran before it ran at start-up
                self.ready_epoch = time.time()
                self.state.emit({"t": "ready", "at": self.ready_epoch})

    def send_smoke(self, healthy):
        """Start the smoke requests at the first health check that passes after the ready
        line; say when they are all answered."""
        if self.smoke is None:
            return
        if self.smoke.thread is None:
            if self.ready and (healthy or (healthy is None and not self.health_url)):
                self.smoke.start()
                self.state.emit({"t": "smoke_started", "started": self.smoke.started})
                self.last_emit = time.monotonic()
            return
        ev = self.smoke.event()
        if ev is not None:
            self.state.emit(ev)
            self.last_emit = time.monotonic()

    RECORDS_EVERY_S = 0.25

    def send_records(self, now):
        """The probe's records not sent yet (each record file is written once, whole): at every
        wake where inotify watches the records (a new one wakes the follow), else every RECORDS_EVERY_S."""
        if self.records is None:
            return
        woken = self.watch_records()
        if (not woken or not woken & self.watch.woken) and now < self.next_records:
            return
        if woken:
            self.watch.woken -= woken
        self.next_records = now + self.RECORDS_EVERY_S
        ev = self.records.event(self.pid or self.req.get("pid"))
        if ev is not None:
            self.state.emit(ev)
            self.last_emit = now

    def watch_records(self):
        """Watch the records dir and each process's dir in it on the log's inotify fd, so that the
        first record wakes the follow (at a 0.25 s timer it was most of a 1-host verdict's wait);
        the watch descriptors (empty: not watched, the timer reads them). Each dir is watched
        before it is read, so that a record written meanwhile is not missed; the records dir is
        listed again only when a dir was created in it (its watch woke), not at every wake."""
        if self.watch is None or self.watch.fd is None or not self.records.records_dir:
            return set()
        root = self.records.records_dir
        if root not in self.records_watched:
            if not self.watch_records_dir(root):
                return set()
        elif self.records_watched[root] not in self.watch.woken:
            return set(self.records_watched.values())
        try:
            names = os.listdir(root)
        except OSError:
            names = []
        for name in names:
            self.watch_records_dir(os.path.join(root, name))
        return set(self.records_watched.values())

    def watch_records_dir(self, path):
        """Watch one dir of the records (once); whether it is watched."""
        if path in self.records_watched:
            return True
        wd = self.watch.watch_dir(path)
        if wd < 0:
            return False
        self.records_watched[path] = wd
        self.watch.woken.add(wd)   # read it once now: what was written before the watch
        return True

    def server_key(self):
        """The restarted server's API key (an apikey.ServerKey), read from its /proc at the first
        request to it (a health check, or the smoke requests); read again while none is found. Not
        found is no answer to keep: a container's main process runs the runtime's init (`runc init`)
        for a moment after `start` returned, before it becomes the server, and a key read then
        would send the smoke requests without it (HTTP 401)."""
        if self.found_key is None or self.found_key.key is None:
            self.found_key = known_key(self.state, self.pid, self.api_key_env)
        return self.found_key

    def check_health(self, now, alive):
        if not self.health_url or now < self.next_health or alive is False:
            return None
        # both engines answer /health without the key; a health_url elsewhere may need it
        status, _ = http_get(self.health_url, timeout=2.0, headers=self.server_key().headers())
        healthy = status == 200
        self.next_health = now + (0.25 if self.ready else 1.0)
        return healthy

    def send_server_info(self, healthy):
        """The server's settings, once, at the first health check that passes."""
        if not healthy or not self.info_url or self.info_sent:
            return
        status, body = http_get(self.info_url, timeout=3.0, headers=self.server_key().headers())
        if status == 200:
            try:
                # SGLang's /server_info holds its server_args, api_key and admin_api_key among them
                data = redact.data(json.loads(body.decode("utf-8", "replace")))
                self.state.emit({"t": "server_info", "data": data})
            except ValueError:
                pass
            self.info_sent = True

    def send_state(self, now, alive, healthy):
        elapsed = round(now - self.started, 3)
        if (healthy is not None or alive is False) and (alive, healthy) != self.last_state:
            self.state.emit({"t": "state", "alive": alive, "healthy": healthy, "elapsed": elapsed})
            self.last_state = (alive, healthy)
            self.last_emit = now
        elif now - self.last_emit >= 0.5:
            # a server that logs nothing after its ready line (no access log) and answers its
            # health checks the same each time must still tick, or the laptop never re-judges
            self.state.emit({"t": "tick", "elapsed": elapsed})
            self.last_emit = now

    def read_followups(self):
        """None while the laptop is still listening; else follow's result, with the
        laptop's follow-up requests (`requests`) for the session to run."""
        line = None if self.state.gone else self.requests.poll(self.poll_wait(), self.wake())
        if self.state.gone or self.requests.eof:
            return {"ended": "stdin closed"}
        if line is None:
            return None
        requests = json.loads(line.decode("utf-8") or "[]")
        return {"ended": "finished", "requests": requests}

    def wake(self):
        """What the wait for the laptop's decision also wakes on: the log (self.watch), and the end of the
        smoke requests while they run (at a POLL_S poll their end was seen up to 50 ms late)."""
        if self.smoke is None or self.smoke.end_fd is None or self.smoke.told or self.watch is None \
                or not self.watch.watching():
            return self.watch
        return SmokeEndWake(self.watch, self.smoke)

    def poll_wait(self):
        """How long the next wait for the laptop's decision may last."""
        if getattr(self.follower, "more", False):
            return 0   # no wait while the log has more to read: a burst is passed on as fast as it is read
        if self.watch is None or not self.watch.watching():
            return self.POLL_S
        wait = self.WATCHED_POLL_S
        if self.smoke is not None and self.smoke.thread is not None and not self.smoke.told \
                and self.smoke.end_fd is None:
            wait = self.POLL_S   # their end writes nothing to the log, and the verdict waits on it
        if self.health_url:   # a health check falls due: that is not a log write
            # at least POLL_S: a check that is overdue and not made (the server is dead) must
            # not turn the wait into a spin until the laptop decides
            wait = min(wait, max(self.POLL_S, self.next_health - time.monotonic()))
        return wait

    def close(self):
        if self.liveness is not None:
            self.liveness.close()
        if self.smoke is not None:
            self.smoke.close()
        close = getattr(self.follower, "close", None)
        if close is not None:
            close()
        if self.watch is not None:
            self.watch.close()


class SmokeEndWake(object):
    """The follow's wake (a LogWatch or StreamWake) with the smoke requests' end beside it, for
    RequestReader.poll: their end wakes the wait as a log write does."""

    def __init__(self, watch, smoke):
        self.watch, self.smoke = watch, smoke

    def fds(self):
        return self.watch.fds() + [self.smoke.end_fd]

    def drain(self):
        self.smoke.ended_signalled()
        self.watch.drain()
