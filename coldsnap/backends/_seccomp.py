"""A seccomp filter that makes io_uring_setup fail with ENOSYS.

CRIU cannot dump io_uring instances, and libuv (uvloop in SGLang's HTTP process, torch's
TCPStore) opens them whenever the kernel offers them; environment switches do not stop it.
Told ENOSYS ("this kernel has no io_uring"), libuv falls back to epoll. The filter is inherited
by every child, kept across exec, and CRIU saves and restores it with the tree.

Standard library only: it also runs inside the launch helper, started with `python -S`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# seccomp_data offsets, BPF opcodes and return values (linux/seccomp.h, linux/filter.h).
_NR, _ARCH = 0, 4
_LD_W_ABS = 0x00 | 0x00 | 0x20
_JEQ_K = 0x05 | 0x10 | 0x00
_RET_K = 0x06 | 0x00
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_I386 = 0x40000003
_X32_SYSCALL_BIT = 0x40000000
IO_URING_SETUP = 425  # the same number for x86_64, x32 (with the x32 bit) and i386

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def io_uring_filter() -> bytes:
    """The BPF program (an array of struct sock_filter): ENOSYS for io_uring_setup, allow the
    rest. It checks the calling ABI first, since syscall numbers differ between ABIs."""
    enosys = _RET_ERRNO | errno.ENOSYS
    return b"".join(
        [
            _insn(_LD_W_ABS, 0, 0, _ARCH),  # 0
            _insn(_JEQ_K, 0, 3, _AUDIT_ARCH_X86_64),  # 1: x86_64 -> 2, else -> 5
            _insn(_LD_W_ABS, 0, 0, _NR),  # 2
            _insn(_JEQ_K, 5, 0, IO_URING_SETUP),  # 3: -> 9 (ENOSYS), else -> 4
            _insn(_JEQ_K, 4, 3, _X32_SYSCALL_BIT | IO_URING_SETUP),  # 4: x32 -> 9, else -> 8
            _insn(_JEQ_K, 0, 2, _AUDIT_ARCH_I386),  # 5: i386 -> 6, else -> 8
            _insn(_LD_W_ABS, 0, 0, _NR),  # 6
            _insn(_JEQ_K, 1, 0, IO_URING_SETUP),  # 7: -> 9, else -> 8
            _insn(_RET_K, 0, 0, _RET_ALLOW),  # 8
            _insn(_RET_K, 0, 0, enosys),  # 9
        ]
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def block_io_uring() -> None:
    """Installs the filter on the calling thread (and so on everything it execs or forks).

    Without CAP_SYS_ADMIN the kernel wants no_new_privs first; as root we leave it unset so
    setuid programs in the tree behave as usual. Raises OSError when the kernel refuses.
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(errno.ENOSYS, f"the io_uring filter is for x86_64, not {platform.machine()}")
    program = io_uring_filter()
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = (
        ctypes.c_int,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    )
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EACCES:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
            return
        err = ctypes.get_errno()
    raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
