//! The process's life: how it ends when a signal arrives, and the temporary output it must not
//! leave behind.
//!
//! - SIGINT, SIGTERM, SIGHUP: remove the temporary output, exit 128 + the signal's number (130,
//!   143, 129), as a shell reports a process killed by it.
//! - SIGPIPE (stdout or stderr closed early, `deltanet selftest | head -1`): the same, quietly,
//!   exit 141, instead of a "Broken pipe" error from the next print.
//! - SIGBUS: a read of the memory-mapped input faulted because the file was truncated while
//!   being read. Remove the temporary output, say so, exit 1 (bad data).
//!
//! The handlers do only what is async-signal-safe: read the registered temporary paths from
//! atomics, `unlink` them, `write` one message, `_exit`.

use std::ffi::{c_char, c_int, CString};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use deltanet::io::AtomicFile;

/// Temporary files being written now, as C strings for `unlink` in a handler. A process writes
/// one output at a time; a few slots leave room.
static TEMPORARIES: [AtomicPtr<c_char>; 4] = [const { AtomicPtr::new(null_mut()) }; 4];

/// A temporary file registered for removal by the signal handlers, until dropped.
pub struct Registered(Option<usize>);

/// Registers `path` for removal if a signal ends the process before [`Registered`] is dropped.
pub fn register(path: &Path) -> Registered {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return Registered(None);
    };
    let raw = c.into_raw();
    for (i, slot) in TEMPORARIES.iter().enumerate() {
        if slot
            .compare_exchange(null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Registered(Some(i));
        }
    }
    // SAFETY: `raw` came from `into_raw` above and was not stored anywhere.
    drop(unsafe { CString::from_raw(raw) });
    Registered(None)
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            // The string is not freed: a handler running on another thread could be reading it
            // right now. One small allocation per output file is the price.
            TEMPORARIES[i].store(null_mut(), Ordering::SeqCst);
        }
    }
}

/// Writes `path` atomically (see [`AtomicFile`]) with `write`, its temporary file registered for
/// removal should a signal end the process meanwhile.
pub fn write_output(
    path: &Path,
    write: impl FnOnce(AtomicFile) -> deltanet::Result<()>,
) -> deltanet::Result<()> {
    // Registered before the file exists, so no signal can come between its creation and its
    // registration.
    let mut registered = None;
    let out = AtomicFile::create_noting(path, &mut |tmp| {
        registered = Some(register(tmp));
    })?;
    let done = write(out);
    drop(registered);
    done
}

fn remove_temporaries() {
    for slot in &TEMPORARIES {
        let p = slot.load(Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: a registered pointer stays valid for the life of the process.
            unsafe { libc::unlink(p) };
        }
    }
}

extern "C" fn on_signal(sig: c_int) {
    remove_temporaries();
    let code = if sig == libc::SIGBUS {
        let msg: &[u8] = b"deltanet: bus error reading the memory-mapped input: it was truncated or rewritten while being read; no output written\n";
        // SAFETY: write(2) on a static buffer is async-signal-safe.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        1
    } else {
        128 + sig
    };
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(code) }
}

/// Installs the handlers described in the module documentation.
pub fn install() {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGPIPE,
        libc::SIGBUS,
    ] {
        // SAFETY: a zeroed sigaction with a handler, an empty mask and no flags is valid; the
        // handler only makes async-signal-safe calls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}
