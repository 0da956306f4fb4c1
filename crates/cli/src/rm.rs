//! `idxfs rm PATH...`: PATH and everything under it removed by the server of the idxfs mount
//! holding it (`idxfs_fuse::rmtree`, the engine's `Fs::remove_tree`), without the request
//! per name `rm -rf` sends through FUSE. Anyone may use it; the server holds the caller to
//! the permission checks `rm -rf` would meet, stopping at the first refusal. PATH's last part
//! is removed as `rm` removes it (a symlink, not what it points to).
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub(crate) fn run(paths: &[PathBuf]) -> Result<(), String> {
    for p in paths {
        one(p)?;
    }
    Ok(())
}

fn one(p: &Path) -> Result<(), String> {
    let shown = p.display();
    let (parent, name) = crate::sync::parent_and_name(p, "remove")?;
    let parent = parent.as_path();
    let (canon, mp) = crate::sync::idxfs_mount(parent, "use rm -r")?;
    if canon.join(name) == mp {
        return Err(format!(
            "{shown}: the mount point itself; unmount it to remove it"
        ));
    }
    let t = Instant::now();
    let mut line = crate::progress_line::Line::new();
    let (files, dirs) = idxfs_fuse::rmtree::remove(parent, name.as_bytes(), |files, dirs| {
        line.show("removed", files + dirs)
    })
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => format!("{shown}: no such file or directory"),
        Some(libc::EROFS) => format!("{shown}: on a read-only file system or snapshot"),
        Some(libc::EACCES) => format!(
            "{shown}: permission denied on the way down (names removed before it stay removed)"
        ),
        Some(libc::EPERM) => format!(
            "{shown}: not permitted: another user's file in a sticky directory \
             (names removed before it stay removed)"
        ),
        Some(libc::EAGAIN) => format!(
            "{shown}: stopped part-way: this user runs as many removals on the mount as one \
             may (names removed before it stay removed)"
        ),
        _ => format!("{shown}: {e}"),
    })?;
    // Cleared before the summary takes its place.
    drop(line);
    println!(
        "{shown}: removed {files} files and {dirs} directories in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
