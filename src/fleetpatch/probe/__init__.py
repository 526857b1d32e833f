"""The probe: proof from execution (runtime.py runs in the server; install.py on the host; verdict.py on the laptop)."""
