"""Worker that never finishes: used to check that tensoropt.launch.run_torchrun kills it."""
import os
import time

print(f"PID {os.getpid()}", flush=True)
while True:
    time.sleep(1)
