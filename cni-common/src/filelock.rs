//! `flock(2)` with a deadline.
//!
//! A blocking `flock` waits for as long as the holder keeps the lock: a plugin stuck elsewhere
//! (or a `SIGSTOP`ped one) would hold every later call of the node forever. [`lock_until`]
//! takes the lock at once when it is free; otherwise one helper thread waits in the blocking
//! call (so waiters are woken by the kernel, without polling) while the caller waits for it with
//! a deadline. Past the deadline the caller gets an error of kind `TimedOut`; the helper keeps
//! waiting and, if it ever gets the lock, releases it at once (it drops the file).

use std::fs::{File, TryLockError};
use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Exclusive (writers) or shared (readers) lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Exclusive,
    Shared,
}

fn try_lock(f: &File, kind: LockKind) -> Result<(), TryLockError> {
    match kind {
        LockKind::Exclusive => f.try_lock(),
        LockKind::Shared => f.try_lock_shared(),
    }
}

fn lock_blocking(f: &File, kind: LockKind) -> io::Result<()> {
    loop {
        let r = match kind {
            LockKind::Exclusive => f.lock(),
            LockKind::Shared => f.lock_shared(),
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Lock `file` (`flock`), waiting at most `timeout`. Hands the file back locked; the lock goes
/// with it when it is dropped. Past the deadline: an error of kind `TimedOut` naming the wait.
pub fn lock_until(file: File, kind: LockKind, timeout: Duration) -> io::Result<File> {
    match try_lock(&file, kind) {
        Ok(()) => return Ok(file),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(e),
    }
    let timed_out = || {
        io::Error::new(io::ErrorKind::TimedOut, format!("still held by another process after {timeout:?}"))
    };
    let deadline = Instant::now() + timeout;
    let (tx, rx) = mpsc::channel();
    let spare = file.try_clone()?;
    let waiter = std::thread::Builder::new().name("flock-wait".into()).spawn(move || {
        let r = lock_blocking(&file, kind).map(|()| file);
        // Nobody listening (the caller gave up): dropping the file releases the lock.
        let _ = tx.send(r);
    });
    if waiter.is_err() {
        // No thread to wait in: poll instead (rare; the process is out of resources).
        let mut pause = Duration::from_millis(1);
        loop {
            match try_lock(&spare, kind) {
                Ok(()) => return Ok(spare),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
    drop(spare);
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(timed_out()),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(io::Error::other("the lock waiter ended")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock_file() -> (std::path::PathBuf, File) {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let p = std::env::temp_dir().join(format!("cni-filelock-{}-{n}", std::process::id()));
        let f = File::create(&p).unwrap();
        (p, f)
    }

    #[test]
    fn free_locks_are_taken_and_held_ones_time_out() {
        let (p, holder) = lock_file();
        holder.lock().unwrap();
        // another open file description of the same file contends like another process
        let e =
            lock_until(File::open(&p).unwrap(), LockKind::Exclusive, Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("still held by another process after 50ms"), "{e}");
        // shared locks coexist, and a waiter gets the lock when the holder lets go
        holder.unlock().unwrap();
        holder.lock_shared().unwrap();
        let reader =
            lock_until(File::open(&p).unwrap(), LockKind::Shared, Duration::from_millis(50)).unwrap();
        drop(reader);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(holder);
        });
        let writer =
            lock_until(File::open(&p).unwrap(), LockKind::Exclusive, Duration::from_secs(10)).unwrap();
        t.join().unwrap();
        assert!(matches!(File::open(&p).unwrap().try_lock(), Err(TryLockError::WouldBlock)));
        drop(writer);
        // the waiter that timed out above let the lock go when it got it: it is free now
        File::open(&p).unwrap().try_lock().unwrap();
        std::fs::remove_file(&p).unwrap();
    }
}
