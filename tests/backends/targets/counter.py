"""A process with SIZE_MB of state that counts; SIGUSR1 makes it report count and checksum."""

import os
import random
import signal
import sys
import time
import zlib

size_mb = int(sys.argv[1])
state = bytearray(random.Random(1234).randbytes(size_mb << 20))
count = 0


def report(*_):
    print(f"report pid={os.getpid()} count={count} checksum={zlib.adler32(state)}", flush=True)


signal.signal(signal.SIGUSR1, report)
print(f"ready pid={os.getpid()} checksum={zlib.adler32(state)}", flush=True)
while True:
    count += 1
    time.sleep(0.005)
