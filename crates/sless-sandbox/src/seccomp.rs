//! The seccomp filter every sandboxed program runs under: a deny-list of system calls that
//! handlers, interpreters and package installs never need and that kernel exploits start
//! with (new namespaces, mounts, ptrace, module loading, keyrings, bpf, io_uring, ...).
//!
//! Refused calls fail with `EPERM` (or `ENOSYS` where a runtime should read "not
//! supported" and fall back: `clone3` to `clone`, io_uring to the thread pool); nothing is
//! killed, so a runtime that probes for a feature keeps working. The program is classic
//! BPF, built here and handed to bubblewrap (`--seccomp FD`), which loads it just before
//! running the program, after its own setup.

/// `struct sock_filter`: one classic BPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    pub(crate) code: u16,
    pub(crate) jt: u8,
    pub(crate) jf: u8,
    pub(crate) k: u32,
}

// Classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
pub(crate) const LD_W_ABS: u16 = 0x20;
pub(crate) const JEQ_K: u16 = 0x15;
pub(crate) const JGE_K: u16 = 0x35;
pub(crate) const JSET_K: u16 = 0x45;
pub(crate) const RET_K: u16 = 0x06;
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of the first argument (all the flags tested here live there).
#[cfg(target_endian = "little")]
const OFF_ARG0_LO: u32 = 16;
#[cfg(target_endian = "big")]
const OFF_ARG0_LO: u32 = 20;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x32 system calls on x86_64 carry this bit; the filter refuses them all.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Namespace flags of `clone` (its low byte is the exit signal, so no `CLONE_NEWTIME`).
const CLONE_NS_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
/// Namespace flags of `unshare`.
const UNSHARE_NS_FLAGS: u32 = CLONE_NS_FLAGS | 0x80; // CLONE_NEWTIME

/// `personality` flags that weaken address-space randomisation or protections.
const PERSONALITY_WEAKENING: u32 = 0x0004_0000 // ADDR_NO_RANDOMIZE
    | 0x0010_0000 // MMAP_PAGE_ZERO
    | 0x0020_0000 // ADDR_COMPAT_LAYOUT
    | 0x0040_0000; // READ_IMPLIES_EXEC
/// `personality(0xffffffff)` only queries the current persona.
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

/// System calls refused outright with `EPERM`.
const DENIED: &[(libc::c_long, &str)] = &[
    // Mounts and file-system views.
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_move_mount, "move_mount"),
    (libc::SYS_open_tree, "open_tree"),
    (libc::SYS_fsopen, "fsopen"),
    (libc::SYS_fsconfig, "fsconfig"),
    (libc::SYS_fsmount, "fsmount"),
    (libc::SYS_fspick, "fspick"),
    (libc::SYS_mount_setattr, "mount_setattr"),
    (libc::SYS_setns, "setns"),
    // Other processes' memory.
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_kcmp, "kcmp"),
    (libc::SYS_pidfd_getfd, "pidfd_getfd"),
    // The kernel itself.
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_syslog, "syslog"),
    (libc::SYS_lookup_dcookie, "lookup_dcookie"),
    // File handles bypass path permissions.
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_name_to_handle_at, "name_to_handle_at"),
    // Host administration.
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_acct, "acct"),
    (libc::SYS_quotactl, "quotactl"),
    (libc::SYS_quotactl_fd, "quotactl_fd"),
    (libc::SYS_settimeofday, "settimeofday"),
    (libc::SYS_clock_settime, "clock_settime"),
    (libc::SYS_clock_adjtime, "clock_adjtime"),
    (libc::SYS_adjtimex, "adjtimex"),
    (libc::SYS_vhangup, "vhangup"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_iopl, "iopl"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_ioperm, "ioperm"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_uselib, "uselib"),
];

/// System calls answered with `ENOSYS`, so callers fall back as on an older kernel.
const UNSUPPORTED: &[(libc::c_long, &str)] = &[
    // Its flags sit in memory a filter cannot read; glibc then uses `clone`, checked below.
    (libc::SYS_clone3, "clone3"),
    // A large attack surface; libuv and others fall back to their thread pools.
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
];

/// The filter as a list of instructions.
pub(crate) fn instructions() -> Vec<Insn> {
    let stmt = |code, k| Insn {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| Insn { code, jt, jf, k };
    let eperm = stmt(RET_K, RET_ERRNO | libc::EPERM as u32);
    let enosys = stmt(RET_K, RET_ERRNO | libc::ENOSYS as u32);
    let allow = stmt(RET_K, RET_ALLOW);
    let nr = |n: libc::c_long| n as u32;

    let mut p = vec![
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        enosys,
        stmt(LD_W_ABS, OFF_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    p.extend([jump(JGE_K, X32_SYSCALL_BIT, 0, 1), enosys]);
    // Each rule is `if nr == X { body } else skip body`; a body always returns, so the
    // accumulator still holds the number when the next rule looks at it.
    for (n, _) in DENIED {
        p.extend([jump(JEQ_K, nr(*n), 0, 1), eperm]);
    }
    for (n, _) in UNSUPPORTED {
        p.extend([jump(JEQ_K, nr(*n), 0, 1), enosys]);
    }
    for (n, mask) in [
        (libc::SYS_clone, CLONE_NS_FLAGS),
        (libc::SYS_unshare, UNSHARE_NS_FLAGS),
    ] {
        p.extend([
            jump(JEQ_K, nr(n), 0, 4),
            stmt(LD_W_ABS, OFF_ARG0_LO),
            jump(JSET_K, mask, 0, 1),
            eperm,
            allow,
        ]);
    }
    p.extend([
        jump(JEQ_K, nr(libc::SYS_personality), 0, 5),
        stmt(LD_W_ABS, OFF_ARG0_LO),
        jump(JEQ_K, PERSONALITY_QUERY, 2, 0),
        jump(JSET_K, PERSONALITY_WEAKENING, 0, 1),
        eperm,
        allow,
    ]);
    p.push(allow);
    p
}

/// The filter in the binary form bubblewrap reads: an array of `struct sock_filter`.
pub(crate) fn program() -> Vec<u8> {
    let insns = instructions();
    let mut bytes = Vec::with_capacity(insns.len() * 8);
    for i in insns {
        bytes.extend_from_slice(&i.code.to_ne_bytes());
        bytes.push(i.jt);
        bytes.push(i.jf);
        bytes.extend_from_slice(&i.k.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter on a system call like the kernel would; returns its verdict.
    fn run(arch: u32, nr: u32, arg0: u64) -> u32 {
        let p = instructions();
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        data[16..24].copy_from_slice(&arg0.to_ne_bytes());
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = p[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let at = i.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().expect("4 bytes"));
                }
                JEQ_K | JGE_K | JSET_K => {
                    let taken = match i.code {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                RET_K => return i.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn call(nr: libc::c_long, arg0: u64) -> u32 {
        run(AUDIT_ARCH, nr as u32, arg0)
    }

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;

    #[test]
    fn ordinary_calls_pass() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_mmap,
            libc::SYS_futex,
            libc::SYS_epoll_pwait,
            libc::SYS_execve,
            libc::SYS_wait4,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_prctl,
            libc::SYS_setresuid,
            libc::SYS_capset,
            libc::SYS_seccomp,
        ] {
            assert_eq!(call(nr, 0), RET_ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn denied_calls_get_eperm_or_enosys() {
        for (nr, name) in DENIED {
            assert_eq!(call(*nr, 0), EPERM, "{name}");
        }
        for (nr, name) in UNSUPPORTED {
            assert_eq!(call(*nr, 0), ENOSYS, "{name}");
        }
    }

    #[test]
    fn clone_and_unshare_refuse_only_namespace_flags() {
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let fork = libc::SIGCHLD as u64;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64;
        for flags in [thread, fork, vfork] {
            assert_eq!(call(libc::SYS_clone, flags), RET_ALLOW, "{flags:#x}");
        }
        for ns in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWCGROUP,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
        ] {
            let ns = ns as u64;
            assert_eq!(call(libc::SYS_clone, fork | ns), EPERM, "clone {ns:#x}");
            assert_eq!(call(libc::SYS_unshare, ns), EPERM, "unshare {ns:#x}");
        }
        assert_eq!(call(libc::SYS_unshare, 0x80), EPERM, "CLONE_NEWTIME");
        assert_eq!(call(libc::SYS_unshare, libc::CLONE_FILES as u64), RET_ALLOW);
        // The upper half of the argument is not a flag anybody can set to slip past.
        assert_eq!(
            call(libc::SYS_unshare, (1 << 32) | libc::CLONE_NEWUSER as u64),
            EPERM
        );
    }

    #[test]
    fn personality_may_query_but_not_weaken() {
        assert_eq!(call(libc::SYS_personality, 0xffff_ffff), RET_ALLOW);
        assert_eq!(call(libc::SYS_personality, 0), RET_ALLOW);
        assert_eq!(call(libc::SYS_personality, 0x0004_0000), EPERM);
        assert_eq!(call(libc::SYS_personality, 0x0040_0000), EPERM);
    }

    #[test]
    fn foreign_abis_are_refused() {
        // i386 (int 0x80 on x86_64) and arm32 compat calls.
        assert_eq!(run(0x4000_0003, libc::SYS_read as u32, 0), ENOSYS);
        assert_eq!(run(0x4000_0028, libc::SYS_read as u32, 0), ENOSYS);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(AUDIT_ARCH, X32_SYSCALL_BIT | libc::SYS_read as u32, 0),
            ENOSYS
        );
    }

    #[test]
    fn jumps_stay_inside_the_program() {
        let p = instructions();
        for (at, i) in p.iter().enumerate() {
            if matches!(i.code, JEQ_K | JGE_K | JSET_K) {
                let target = at + 1 + usize::from(i.jt.max(i.jf));
                assert!(target < p.len(), "instruction {at} jumps past the end");
            }
        }
        assert_eq!(p.last().map(|i| (i.code, i.k)), Some((RET_K, RET_ALLOW)));
        assert_eq!(program().len(), p.len() * 8);
        assert!(p.len() < 4096, "BPF_MAXINSNS");
    }
}
