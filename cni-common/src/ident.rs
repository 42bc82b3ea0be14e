//! Build identity markers: how a binary of this suite proves, without being run, that it is a
//! particular build of a particular plugin.
//!
//! A plugin binary that others may run in-process (an IPAM plugin) carries its identity — a byte
//! string made of a magic, the plugin's name, the crate version, the commit and a random
//! per-build id — in a dedicated ELF section named [`SECTION`]. Another binary of the same build
//! knows the expected bytes at compile time and asks [`file_carries`] whether a file on disk
//! holds exactly them.
//!
//! [`file_carries`] never executes the file and never reads it whole: it opens it, checks the
//! metadata, and makes four bounded reads (ELF header, section header table, section name
//! table, the marker section). Any deviation from the expected shape — not a regular file,
//! not runnable by this process, set-id bits, file capabilities, not an ELF file of this
//! machine's class, byte order and architecture, an implausible or out-of-bounds table, a
//! missing or duplicated marker section, different bytes — answers `false`.

use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Name of the ELF section holding a binary's identity.
pub const SECTION: &str = ".cni_rs_ident";

/// First bytes of every identity (the rest is `name\0version\0build-id\0`).
pub const MAGIC: &[u8] = b"cni-rs build identity v1\0";

/// Bounds of what is read: real binaries have a few dozen sections and a section name table
/// of a few hundred bytes.
const MAX_SECTIONS: usize = 1024;
const MAX_SHSTRTAB: u64 = 64 * 1024;
const MAX_MARKER: usize = 4096;

const EHDR_LEN: usize = 64;
const SHDR_LEN: usize = 64;
const SHT_PROGBITS: u32 = 1;
const SHT_STRTAB: u32 = 3;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;

/// `e_machine` of the architecture this code runs on (None: no fast path on this architecture).
const fn native_machine() -> Option<u16> {
    if cfg!(target_arch = "x86_64") {
        Some(62)
    } else if cfg!(target_arch = "aarch64") {
        Some(183)
    } else if cfg!(target_arch = "riscv64") {
        Some(243)
    } else if cfg!(target_arch = "powerpc64") {
        Some(21)
    } else if cfg!(target_arch = "s390x") {
        Some(22)
    } else if cfg!(target_arch = "loongarch64") {
        Some(258)
    } else {
        None
    }
}

/// Copy `s` into an array of its exact length (for a `#[link_section]` static).
pub const fn to_array<const N: usize>(s: &[u8]) -> [u8; N] {
    assert!(s.len() == N, "length mismatch");
    let mut a = [0u8; N];
    let mut i = 0;
    while i < N {
        a[i] = s[i];
        i += 1;
    }
    a
}

/// Whether the file at `path` is an ELF executable, runnable by this process, whose section
/// [`SECTION`] holds exactly `expected`. See the module docs for everything checked.
pub fn file_carries(path: &Path, expected: &[u8]) -> bool {
    if expected.is_empty() || expected.len() > MAX_MARKER || !runnable(path) {
        return false;
    }
    // O_NONBLOCK: a FIFO put there meanwhile must not block the open.
    let Ok(file) = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)
    else {
        return false;
    };
    let Ok(meta) = file.metadata() else { return false };
    if !meta.file_type().is_file() || meta.mode() & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return false;
    }
    if has_file_capabilities(&file) {
        return false;
    }
    matches!(read_section(&file, meta.len(), SECTION, expected.len()), Some(bytes) if bytes == expected)
}

/// What execve would check first: the caller may execute the file (mode bits, ACLs, a
/// `noexec` mount).
fn runnable(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// A file with capabilities would run with more privilege than we have: not equivalent.
fn has_file_capabilities(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: size query (null buffer, length 0) on a valid descriptor with a static name.
    let r = unsafe {
        libc::fgetxattr(file.as_raw_fd(), c"security.capability".as_ptr(), std::ptr::null_mut(), 0)
    };
    if r >= 0 {
        return true;
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    // No such attribute, or a file system without extended attributes: no capabilities.
    !matches!(errno, Some(libc::ENODATA) | Some(libc::EOPNOTSUPP))
}

fn read_exact_at(file: &File, len: usize, offset: u64, file_len: u64) -> Option<Vec<u8>> {
    let end = offset.checked_add(len as u64)?;
    if end > file_len {
        return None;
    }
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A section header: (name offset, type, file offset, size).
fn section(table: &[u8], i: usize) -> (u32, u32, u64, u64) {
    let h = &table[i * SHDR_LEN..(i + 1) * SHDR_LEN];
    (u32_at(h, 0), u32_at(h, 4), u64_at(h, 24), u64_at(h, 32))
}

/// The bytes of the only `SHT_PROGBITS` section called `name`, if it is exactly `len` bytes
/// long. Only native 64-bit ELF files are understood.
fn read_section(file: &File, file_len: u64, name: &str, len: usize) -> Option<Vec<u8>> {
    if !cfg!(target_pointer_width = "64") {
        return None;
    }
    let machine = native_machine()?;
    let eh = read_exact_at(file, EHDR_LEN, 0, file_len)?;
    let data = if cfg!(target_endian = "little") { 1 } else { 2 };
    // magic, ELFCLASS64, byte order, EV_CURRENT
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != data || eh[6] != 1 {
        return None;
    }
    let (e_type, e_machine) = (u16_at(&eh, 16), u16_at(&eh, 18));
    if !matches!(e_type, ET_EXEC | ET_DYN) || e_machine != machine || u32_at(&eh, 20) != 1 {
        return None;
    }
    let shoff = u64_at(&eh, 40);
    let (shentsize, shnum, shstrndx) =
        (u16_at(&eh, 58) as usize, u16_at(&eh, 60) as usize, u16_at(&eh, 62) as usize);
    // shnum == 0 (extended numbering) or shstrndx == SHN_XINDEX: not a shape we expect.
    if shentsize != SHDR_LEN || shnum == 0 || shnum > MAX_SECTIONS || shstrndx >= shnum {
        return None;
    }
    let table = read_exact_at(file, shnum * SHDR_LEN, shoff, file_len)?;
    let (_, strtype, stroff, strsize) = section(&table, shstrndx);
    if strtype != SHT_STRTAB || strsize == 0 || strsize > MAX_SHSTRTAB {
        return None;
    }
    let names = read_exact_at(file, strsize as usize, stroff, file_len)?;
    let name_at = |off: u32| -> Option<&[u8]> {
        let rest = names.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(&rest[..end])
    };
    let mut found = None;
    for i in 0..shnum {
        let (name_off, kind, off, size) = section(&table, i);
        if name_at(name_off) != Some(name.as_bytes()) {
            continue;
        }
        if found.is_some() || kind != SHT_PROGBITS || size != len as u64 {
            return None; // two of them, or not what we put there: doubt
        }
        found = Some(off);
    }
    read_exact_at(file, len, found?, file_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// A minimal, well-formed ELF64 image for this machine: header, a `.shstrtab`, sections
    /// `extra` (name, type, contents), section header table at the end.
    fn image(extra: &[(&str, u32, &[u8])]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_offs = Vec::new();
        for (n, _, _) in extra {
            name_offs.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let shstr_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let mut body = vec![0u8; EHDR_LEN];
        let mut headers = vec![[0u8; SHDR_LEN]]; // SHN_UNDEF
        for (i, (_, kind, bytes)) in extra.iter().enumerate() {
            let off = body.len() as u64;
            body.extend_from_slice(bytes);
            headers.push(shdr(name_offs[i], *kind, off, bytes.len() as u64));
        }
        let off = body.len() as u64;
        body.extend_from_slice(&names);
        headers.push(shdr(shstr_name, SHT_STRTAB, off, names.len() as u64));
        let shoff = body.len() as u64;
        for h in &headers {
            body.extend_from_slice(h);
        }
        let e = &mut body[..EHDR_LEN];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = if cfg!(target_endian = "little") { 1 } else { 2 };
        e[6] = 1;
        e[16..18].copy_from_slice(&ET_DYN.to_ne_bytes());
        e[18..20].copy_from_slice(&native_machine().unwrap().to_ne_bytes());
        e[20..24].copy_from_slice(&1u32.to_ne_bytes());
        e[40..48].copy_from_slice(&shoff.to_ne_bytes());
        e[52..54].copy_from_slice(&(EHDR_LEN as u16).to_ne_bytes());
        e[58..60].copy_from_slice(&(SHDR_LEN as u16).to_ne_bytes());
        e[60..62].copy_from_slice(&(headers.len() as u16).to_ne_bytes());
        e[62..64].copy_from_slice(&((headers.len() - 1) as u16).to_ne_bytes());
        body
    }

    fn shdr(name: u32, kind: u32, off: u64, size: u64) -> [u8; SHDR_LEN] {
        let mut h = [0u8; SHDR_LEN];
        h[0..4].copy_from_slice(&name.to_ne_bytes());
        h[4..8].copy_from_slice(&kind.to_ne_bytes());
        h[24..32].copy_from_slice(&off.to_ne_bytes());
        h[32..40].copy_from_slice(&size.to_ne_bytes());
        h
    }

    fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn recognises_exactly_the_expected_marker() {
        let d = tempdir();
        let marker = b"cni-rs build identity v1\0some-ipam\x000.1.0\0abc\0";
        let good = write(
            &d,
            "good",
            &image(&[(".text", SHT_PROGBITS, b"code"), (SECTION, SHT_PROGBITS, marker)]),
            0o755,
        );
        assert!(file_carries(&good, marker));
        // another build: same length, other bytes
        let mut other = marker.to_vec();
        other[40] ^= 1;
        assert!(!file_carries(&good, &other));
        // another length
        assert!(!file_carries(&good, &marker[..marker.len() - 1]));
        assert!(!file_carries(&good, b""));

        // not executable: execve would refuse it, so must we
        let noexec = write(&d, "noexec", &image(&[(SECTION, SHT_PROGBITS, marker)]), 0o644);
        // root passes access(X_OK) only if some x bit is set
        assert!(!file_carries(&noexec, marker));
        // set-id bits
        let suid = write(&d, "suid", &image(&[(SECTION, SHT_PROGBITS, marker)]), 0o4755);
        assert!(!file_carries(&suid, marker));
        // the marker twice, or as the wrong type
        let twice = write(
            &d,
            "twice",
            &image(&[(SECTION, SHT_PROGBITS, marker), (SECTION, SHT_PROGBITS, marker)]),
            0o755,
        );
        assert!(!file_carries(&twice, marker));
        let nobits = write(&d, "nobits", &image(&[(SECTION, 8, marker)]), 0o755);
        assert!(!file_carries(&nobits, marker));
        // no marker at all; a script; a directory; nothing
        let none = write(&d, "none", &image(&[(".text", SHT_PROGBITS, b"code")]), 0o755);
        assert!(!file_carries(&none, marker));
        let script = write(&d, "script", b"#!/bin/sh\nexit 0\n", 0o755);
        assert!(!file_carries(&script, marker));
        assert!(!file_carries(&d, marker));
        assert!(!file_carries(&d.join("missing"), marker));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn damaged_headers_are_refused_not_trusted() {
        let d = tempdir();
        let marker = b"cni-rs build identity v1\0x\0";
        let base = image(&[(SECTION, SHT_PROGBITS, marker)]);
        let p = write(&d, "ok", &base, 0o755);
        assert!(file_carries(&p, marker));
        let patches: &[(&str, usize, &[u8])] = &[
            ("32-bit class", 4, &[1]),
            ("other byte order", 5, &[if cfg!(target_endian = "little") { 2 } else { 1 }]),
            ("relocatable object", 16, &1u16.to_ne_bytes()),
            ("other machine", 18, &0xbeefu16.to_ne_bytes()),
            ("section table beyond the end", 40, &u64::MAX.to_ne_bytes()),
            ("odd section header size", 58, &40u16.to_ne_bytes()),
            ("extended numbering", 60, &0u16.to_ne_bytes()),
            ("name table index out of range", 62, &0xffffu16.to_ne_bytes()),
        ];
        for (what, at, bytes) in patches {
            let mut img = base.clone();
            img[*at..*at + bytes.len()].copy_from_slice(bytes);
            let p = write(&d, "patched", &img, 0o755);
            assert!(!file_carries(&p, marker), "{what}");
        }
        // truncated anywhere: header, inside the table
        for cut in [10, base.len() - 1] {
            let p = write(&d, "cut", &base[..cut], 0o755);
            assert!(!file_carries(&p, marker), "truncated at {cut}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempdir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "cni-ident-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
