"""A torch process that multiplies bf16 matrices (oneDNN asks for AMX where the CPU has it).
Reports the answer and the process's XCOMP permission mask at start and on each SIGUSR1."""

import ctypes
import os
import signal
import time

import torch

ARCH_GET_XCOMP_PERM = 0x1022
libc = ctypes.CDLL(None, use_errno=True)
a = torch.arange(256 * 256, dtype=torch.float32).reshape(256, 256).remainder(7).to(torch.bfloat16)
b = torch.eye(256, dtype=torch.bfloat16) * 2
expected = (a.float() @ b.float()).sum().item()


def perm() -> str:
    mask = ctypes.c_uint64(0)
    if libc.syscall(158, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return "unknown"
    return hex(mask.value)


def report(*_):
    got = (a @ b).float().sum().item()
    print(f"report got={got} expected={expected} perm={perm()}", flush=True)


report()
signal.signal(signal.SIGUSR1, report)
print(f"ready pid={os.getpid()}", flush=True)
while True:
    time.sleep(0.01)
