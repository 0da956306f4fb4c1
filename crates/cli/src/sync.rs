//! `idxfs sync PATH`: makes every change on the idxfs mount holding PATH durable; and
//! `idxfs trim DIR`, which finds its mount the same way.
//!
//! `sync` and `sync -f` (sync(2), syncfs(2)) return 0 on a FUSE mount without the server
//! hearing of them: the kernel sends FUSE_SYNCFS only to virtiofs servers (a FUSE server
//! could otherwise stall every sync on the machine), and only dirty pages of a writeback-cache
//! mount reach the server. An fsync does reach it, and idxfs's fsync makes every change of
//! the mount durable, not only the file's (its log batch carries every item changed since
//! the last one), so this is one fsync of PATH, after checking that PATH is on idxfs.
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The mount point and file system type of the mount holding `path` (the longest mount
/// point of /proc/self/mountinfo that contains it).
fn mount_of(path: &Path) -> Result<(PathBuf, String), String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    info.lines()
        .filter_map(|l| {
            // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [FIELDS...] - FSTYPE SOURCE SUPER"
            let mp = unescape(l.split(' ').nth(4)?);
            let fstype = l.split(" - ").nth(1)?.split(' ').next()?.to_string();
            path.starts_with(&mp).then_some((mp, fstype))
        })
        .max_by_key(|(mp, _)| mp.as_os_str().len())
        .ok_or_else(|| format!("{}: on no mount", path.display()))
}

/// A mountinfo path: spaces, tabs, newlines and backslashes come as octal escapes.
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// `path` made absolute, and the idxfs mount holding it; `elsewhere`: what to use on
/// another file system, for the message.
pub(crate) fn idxfs_mount(path: &Path, elsewhere: &str) -> Result<(PathBuf, PathBuf), String> {
    let p = path.display();
    let canon = std::fs::canonicalize(path).map_err(|e| format!("{p}: {e}"))?;
    let (mp, fstype) = mount_of(&canon)?;
    if fstype != "fuse.idxfs" {
        return Err(format!(
            "{p}: on a {fstype} file system at {}, not idxfs ({elsewhere})",
            mp.display()
        ));
    }
    Ok((canon, mp))
}

/// A path's parent directory ("." when it has none) and its last name, for a command that
/// acts on that name; "." and ".." are refused as the last part, as rm refuses them (which
/// `Path` would drop or keep). `verb` says what the command would do with it.
pub(crate) fn parent_and_name<'a>(
    p: &'a Path,
    verb: &str,
) -> Result<(PathBuf, &'a std::ffi::OsStr), String> {
    use std::os::unix::ffi::OsStrExt;
    let last = p
        .as_os_str()
        .as_bytes()
        .split(|b| *b == b'/')
        .rfind(|s| !s.is_empty())
        .unwrap_or_default();
    let name = p
        .file_name()
        .filter(|_| last != b"." && last != b"..")
        .ok_or_else(|| format!("{}: not a name to {verb}", p.display()))?;
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Makes every change on the idxfs mount holding `path` durable; returns the mount point.
pub(crate) fn sync(path: &Path) -> Result<PathBuf, String> {
    let p = path.display();
    let (canon, mp) = idxfs_mount(path, "use sync(1) there")?;
    let f = std::fs::File::open(&canon).map_err(|e| format!("{p}: {e}"))?;
    f.sync_all()
        .map_err(|e| format!("{p}: fsync: {e} (the changes may not be durable)"))?;
    Ok(mp)
}

/// `idxfs trim DIR`: the idxfs mount holding `dir` gives its free blocks back
/// (`idxfs_fuse::trim`); returns the mount point and the blocks discarded.
pub(crate) fn trim_mount(dir: &Path) -> Result<(PathBuf, u64), String> {
    let (_, mp) = idxfs_mount(dir, "fstrim(8) trims that")?;
    let n = idxfs_fuse::trim::trim_mount(&mp).map_err(|e| e.to_string())?;
    Ok((mp, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/mnt/a\\040b"), PathBuf::from("/mnt/a b"));
        assert_eq!(unescape("/x\\134y\\011"), PathBuf::from("/x\\y\t"));
        assert_eq!(unescape("/plain\\0"), PathBuf::from("/plain\\0"));
    }
}
