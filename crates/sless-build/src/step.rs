//! Running one sandboxed build step: its output streamed line by line to the
//! build log, the last lines kept for the error message, bounded by a deadline.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sless_sandbox::{Exit, ProcessSpec, Sandbox};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::{BuildError, LogFn};

/// How many lines of output a failure message ends with.
pub(crate) const TAIL_LINES: usize = 20;

/// Longer lines are cut in the log, so one runaway line cannot eat memory.
const MAX_LINE: usize = 4096;

/// The prefix of the one line a runtime shim prints when the entrypoint is missing.
const SHIM_PREFIX: &str = "sless: ";

/// How long to wait for the output pipes to drain after the process has gone.
/// The pipes close when the sandbox's pid namespace ends, which is immediate; this
/// only bounds a sandbox that misbehaves.
const DRAIN: Duration = Duration::from_secs(5);

/// How a step ended.
#[derive(Debug)]
pub(crate) enum StepEnd {
    Exited(Exit),
    /// The deadline passed; the process was killed.
    TimedOut,
}

/// What a finished step left behind.
#[derive(Debug)]
pub(crate) struct StepOutput {
    pub(crate) end: StepEnd,
    /// The last [`TAIL_LINES`] lines of stdout and stderr, interleaved as read.
    pub(crate) tail: Vec<String>,
    /// The first line starting with `sless: `, without the prefix.
    pub(crate) shim_line: Option<String>,
}

#[derive(Default)]
struct Collected {
    tail: VecDeque<String>,
    shim_line: Option<String>,
}

impl Collected {
    fn push(&mut self, line: &str) {
        if self.shim_line.is_none()
            && let Some(rest) = line.strip_prefix(SHIM_PREFIX)
        {
            self.shim_line = Some(rest.to_string());
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_string());
    }
}

/// Runs `spec` in the sandbox until it exits or `deadline` passes.
pub(crate) async fn run(
    sandbox: &Sandbox,
    spec: &ProcessSpec,
    log: &LogFn,
    deadline: Instant,
) -> Result<StepOutput, BuildError> {
    let mut child = sandbox.spawn(spec)?;
    let collected = Arc::new(Mutex::new(Collected::default()));
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(tokio::spawn(pump(out, log.clone(), collected.clone())));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(tokio::spawn(pump(err, log.clone(), collected.clone())));
    }

    let end = tokio::select! {
        exit = child.wait() => StepEnd::Exited(exit),
        () = tokio::time::sleep_until(deadline) => {
            child.killer().kill();
            child.wait().await;
            StepEnd::TimedOut
        }
    };
    for pump in pumps {
        // A pump that outlives the drain time is cut off: its last lines are lost,
        // the result is not.
        if tokio::time::timeout(DRAIN, pump).await.is_err() {
            tracing::warn!(id = %spec.id, "build output did not close after the process ended");
        }
    }
    drop(child);

    let collected = std::mem::take(&mut *collected.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(StepOutput {
        end,
        tail: collected.tail.into(),
        shim_line: collected.shim_line,
    })
}

/// Forwards `reader` to the log a line at a time.
async fn pump(mut reader: impl AsyncRead + Unpin, log: LogFn, collected: Arc<Mutex<Collected>>) {
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let emit = |line: &mut Vec<u8>| {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\r');
        log(text);
        collected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(text);
        line.clear();
    };
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                emit(&mut line);
            } else if line.len() < MAX_LINE {
                line.push(b);
            } else {
                // Over-long line: the rest of it up to the newline is dropped.
                continue;
            }
        }
    }
    if !line.is_empty() {
        emit(&mut line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pump_splits_lines_and_keeps_the_tail() {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = seen.clone();
        let log: LogFn = Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string()));
        let collected = Arc::new(Mutex::new(Collected::default()));
        let mut input = String::new();
        for i in 0..30 {
            input.push_str(&format!("line {i}\r\n"));
        }
        input.push_str("sless: entrypoint module \"h\" not found\n");
        input.push_str(&"x".repeat(MAX_LINE + 100));
        input.push_str("\nno newline at the end");
        pump(input.as_bytes(), log, collected.clone()).await;

        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 33);
        assert_eq!(seen[0], "line 0");
        assert_eq!(seen[31].len(), MAX_LINE);
        assert_eq!(seen[32], "no newline at the end");
        let c = collected.lock().unwrap();
        assert_eq!(c.tail.len(), TAIL_LINES);
        assert_eq!(
            c.tail.back().map(String::as_str),
            Some("no newline at the end")
        );
        assert_eq!(
            c.shim_line.as_deref(),
            Some("entrypoint module \"h\" not found")
        );
    }
}
