//! `idxfs cp SRC DST`: SRC and everything under it copied to DST by the server of the idxfs
//! mount holding both (`idxfs_fuse::cptree`, the engine's `Fs::copy_tree`), as `cp -a
//! --reflink` copies it but without the requests per name `cp -a` sends through FUSE, and
//! with the data shared, not read and written. As cp: when DST is an existing directory the
//! copy goes into it under SRC's name; a name that exists is refused, never merged into.
//! SRC may be in a snapshot (`MOUNT/.snapshots/NAME/...`, or `MOUNT/.snapshots/NAME` whole):
//! the copy shares the snapshot's blocks, a tree restored at the cost of its metadata.
//! Root and the mount's owner copy as root's `cp -a` does, owners and modes kept; anyone
//! else as their own `cp -a` would: the copies theirs, and what they may not read or make
//! left out, each counted, and the first named (`idxfs_fuse::permission::CopyChecks`).
//! Unlike `cp`, it needs read permission on DST's parent, which it opens to ask the server.
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

pub(crate) fn run(src: &Path, dst: &Path) -> Result<(), String> {
    let (s, d) = (src.display(), dst.display());
    let (src_parent, src_name) = crate::sync::parent_and_name(src, "copy")?;
    let (canon, mp) = crate::sync::idxfs_mount(&src_parent, "use cp -a")?;
    if canon.join(src_name) == mp {
        return Err(format!(
            "{s}: the mount point itself; name a directory in it"
        ));
    }
    let (dst_parent, dst_name) = match std::fs::metadata(dst) {
        Ok(m) if m.is_dir() => (dst.to_path_buf(), src_name.to_os_string()),
        _ => {
            let (p, n) = crate::sync::parent_and_name(dst, "copy to")?;
            (p, n.to_os_string())
        }
    };
    let (_, dst_mp) = crate::sync::idxfs_mount(&dst_parent, "use cp -a")?;
    let stat = |p: &Path| std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()));
    let (sp, dp) = (stat(&src_parent)?, stat(&dst_parent)?);
    if dst_mp != mp || sp.dev() != dp.dev() {
        return Err(format!(
            "{s} and {d}: not on the same idxfs mount (use cp -a between mounts)"
        ));
    }
    // With the writeback cache, pages written to the source wait in the kernel: sent to the
    // server first (what `idxfs snapshot MOUNT` does, with the same limit: README).
    let root = std::fs::File::open(&mp).map_err(|e| format!("{}: {e}", mp.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: syncfs(2) on a descriptor we hold.
    if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
        return Err(format!(
            "{}: syncfs: {}",
            mp.display(),
            std::io::Error::last_os_error()
        ));
    }
    let shown = dst_parent.join(&dst_name);
    let t = Instant::now();
    let mut line = crate::progress_line::Line::new();
    let c = idxfs_fuse::cptree::copy(
        &dst_parent,
        sp.ino(),
        src_name.as_bytes(),
        dst_name.as_bytes(),
        |c| line.show("copied", c.files + c.dirs),
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => format!("{s}: no such file or directory"),
        Some(libc::EEXIST) => format!("{}: exists (idxfs cp makes a new name)", shown.display()),
        Some(libc::EINVAL) => format!("{s}: cannot copy a directory into itself"),
        Some(libc::EXDEV) => format!("{s}: the snapshots directory; copy one snapshot out of it"),
        Some(libc::EACCES) => format!("{s} -> {}: permission denied", shown.display()),
        Some(libc::EPERM) => format!("{s} -> {}: operation not permitted", shown.display()),
        Some(libc::EAGAIN) => format!(
            "{}: stopped part-way: this user runs as many copies on the mount as one may \
             (the part copied stays; remove it with idxfs rm)",
            shown.display()
        ),
        Some(libc::ENOSPC) => format!(
            "{}: no space left; the part copied stays (remove it with idxfs rm)",
            shown.display()
        ),
        _ => format!("{s}: {e}"),
    })?;
    // Cleared before the summary takes its place.
    drop(line);
    println!(
        "{s} -> {}: copied {} files and {} directories ({} bytes) in {:.2} s",
        shown.display(),
        c.files,
        c.dirs,
        c.bytes,
        t.elapsed().as_secs_f64()
    );
    match c.first {
        None => Ok(()),
        Some((path, errno)) => {
            let at = match path.is_empty() {
                true => src.to_path_buf(),
                false => src.join(std::ffi::OsStr::from_bytes(&path)),
            };
            let why = match errno {
                libc::EACCES => "permission denied".to_string(),
                libc::EPERM => "operation not permitted".to_string(),
                e => std::io::Error::from_raw_os_error(e).to_string(),
            };
            let others = match c.refused {
                0 | 1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            Err(format!("not copied: {}: {why}{others}", at.display()))
        }
    }
}
