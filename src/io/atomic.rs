//! Atomic output: a file is filled under a temporary name beside its destination, flushed, and
//! only then renamed over it, so a reader sees either the old file or the whole new one.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A file being written atomically to a destination path.
///
/// [`AtomicFile::create`] opens a new temporary file in the destination's folder (so the final
/// rename stays on one file system); [`AtomicFile::commit`] flushes it to disk and renames it
/// over the destination. Dropped without a commit (an error, a panic unwinding), it removes the
/// temporary file: the destination is never left partial nor clobbered. A process that is
/// killed cannot run the drop; a caller that handles signals can remove
/// [`AtomicFile::temp_path`] itself.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    dir: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

impl AtomicFile {
    /// Creates the temporary file for an atomic write of `path`. Fails, naming `path`, when its
    /// folder does not exist or cannot be written, or when `path` is a directory.
    pub fn create(path: &Path) -> Result<AtomicFile> {
        AtomicFile::create_noting(path, &mut |_| {})
    }

    /// [`AtomicFile::create`], telling `note` each temporary name before a file of that name is
    /// created: whoever must remove the file should the process be killed (a signal handler)
    /// knows of it before it exists.
    pub fn create_noting(path: &Path, note: &mut dyn FnMut(&Path)) -> Result<AtomicFile> {
        let (dir, name) = output_folder(path)?;
        // A unique name in the same folder, opened with create_new so an existing file is never
        // reused.
        let mut attempt = 0u32;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let tmp = dir.join(format!(
                ".{}.{}-{nanos}-{attempt}.tmp",
                name,
                std::process::id()
            ));
            note(&tmp);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
            {
                Ok(f) => {
                    return Ok(AtomicFile {
                        path: path.to_path_buf(),
                        dir,
                        tmp,
                        file: Some(f),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1
                }
                Err(e) => {
                    return Err(Error::file(
                        path,
                        format!("cannot create a temporary file beside it: {e}"),
                    ))
                }
            }
        }
    }

    /// The destination.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary file being written.
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// The temporary file, to write into.
    pub fn file(&mut self) -> Result<&mut File> {
        self.file
            .as_mut()
            .ok_or_else(|| Error::Internal("atomic file used after commit".into()))
    }

    /// Flushes the data to disk and renames the temporary file over the destination.
    pub fn commit(mut self) -> Result<()> {
        let path = self.path.clone();
        let ctx =
            |what: &str, e: &dyn std::fmt::Display| Error::file(&path, format!("{what}: {e}"));
        let file = self.file()?;
        file.sync_all().map_err(|e| ctx("cannot write", &e))?;
        self.file = None;
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| ctx("cannot rename the temporary file over it", &e))?;
        // Renamed: nothing left for the drop to remove.
        self.tmp = PathBuf::new();
        // Make the rename itself durable; failure here cannot undo it, so it is best effort.
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        self.file = None;
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// The existing folder and the file name of an output path; `Err` naming `path` when it has no
/// file name, is a directory, or its folder does not exist.
fn output_folder(path: &Path) -> Result<(PathBuf, String)> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::file(path, "expected a file name for the output, got none"))?;
    if path.is_dir() {
        return Err(Error::file(
            path,
            "expected an output file path, got a directory",
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::file(
            path,
            format!(
                "expected an existing folder for the output, got none at {}",
                dir.display()
            ),
        ));
    }
    Ok((dir, name.to_string_lossy().into_owned()))
}

/// Creates a file at `path` atomically (see [`AtomicFile`]): `write` fills the temporary file,
/// which is committed only if it succeeds.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let mut out = AtomicFile::create(path)?;
    write(out.file()?)?;
    out.commit()
}

/// Fails, naming `path`, unless an atomic write of `path` could start now: its folder exists and
/// is writable, and `path` is not a directory nor a special file (a FIFO or device node would be
/// replaced by a regular file). For checking an output before long work; it creates nothing.
pub fn check_output_path(path: &Path) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return Err(Error::file(
            path,
            "expected a regular file path for the output, got a special file (FIFO, device or socket)",
        ));
    }
    let (dir, _) = output_folder(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Error::file(path, "expected a path without NUL bytes"))?;
        // SAFETY: access(2) reads a NUL-terminated path and nothing else.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::file(
                path,
                format!(
                    "expected a writable folder for the output, got {}: {e}",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A fresh folder, removed when the test passes (kept when it fails).
    fn scratch(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("deltanet-atomic-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch folder");
        Scratch(d)
    }

    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn names(dir: &Path) -> Vec<std::ffi::OsString> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .and_then(|d| d.map(|e| e.map(|e| e.file_name())).collect())
            .expect("read folder");
        v.sort();
        v
    }

    #[test]
    fn a_commit_renames_and_a_drop_removes() {
        let dir = scratch("commit");
        let path = dir.join("out.bin");
        std::fs::write(&path, b"old").expect("write");
        let mut noted = Vec::new();
        let mut f =
            AtomicFile::create_noting(&path, &mut |p| noted.push(p.to_path_buf())).expect("create");
        assert_eq!(noted, [f.temp_path().to_path_buf()]);
        assert!(f.temp_path().exists());
        f.file().expect("file").write_all(b"new").expect("write");
        // Not committed: the old file stays, the temporary goes.
        drop(f);
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        assert_eq!(names(&dir), ["out.bin"]);
        write_atomic_with(&path, |f| {
            f.write_all(b"new").map_err(|e| Error::file(&path, e))
        })
        .expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        assert_eq!(names(&dir), ["out.bin"]);
        // A failed write leaves the old file.
        let e = write_atomic_with(&path, |_| Err(Error::file(&path, "refused")));
        assert!(e.is_err());
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        assert_eq!(names(&dir), ["out.bin"]);
    }

    #[test]
    fn output_paths_are_checked_without_creating_anything() {
        let dir = scratch("check");
        check_output_path(&dir.join("fine.bin")).expect("a new file in a folder");
        let e = check_output_path(&dir.join("no/such/out.bin")).expect_err("missing folder");
        assert!(e.to_string().contains("existing folder"), "{e}");
        let e = check_output_path(&dir).expect_err("a directory");
        assert!(e.to_string().contains("got a directory"), "{e}");
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let e = check_output_path(&fifo).expect_err("a FIFO");
        assert!(e.to_string().contains("special file"), "{e}");
        assert_eq!(names(&dir), ["fifo"]);
    }
}
