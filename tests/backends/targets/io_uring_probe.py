"""Prints what io_uring_setup (x86_64 syscall 425) and a few ordinary syscalls return."""

import ctypes
import os
import socket
import tempfile

libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 1, params)
err = ctypes.get_errno() if fd < 0 else 0
if fd >= 0:
    os.close(fd)
with tempfile.TemporaryFile() as f:
    f.write(b"x")
    f.seek(0)
    io_ok = f.read() == b"x"
socket.socket().close()
print(f"io_uring_setup={fd} errno={err} getpid={os.getpid() > 0} io={io_ok}", flush=True)
