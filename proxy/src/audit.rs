//! The per-request audit line, written without `tracing`'s JSON formatter.
//!
//! Every proxied request ends with one line on stdout, in the shape `tracing-subscriber`'s JSON
//! format gives every other log line of the process (`timestamp`, `level`, `fields`, `target`),
//! so log pipelines see one format. The generic formatter cost about 2 µs per request at
//! saturation (field visitors, `serde_json` escaping, timestamp formatting, UTF-8 re-validation;
//! `perf/results/profile-round1.md`); this writer formats the fixed set of fields straight into a
//! line buffer and caches the timestamp's date and time of day per second (per thread).
//!
//! The request's thread never writes to stdout itself: a pingora worker that blocked on a full
//! pipe (a slow log collector) would stall every request it serves. Lines go through a bounded
//! buffer ([`QUEUE_LINES`]) that one writer thread takes and writes every [`BATCH_INTERVAL`], so
//! that queuing a line wakes no thread and allocates nothing. When the buffer is
//! full the line is dropped and counted, and the writer reports how many it lost with a warning
//! once stdout has caught up. [`flush`] waits (bounded) until the queued lines are written; the
//! process calls it before it exits.
//!
//! The line is written only when the process's `tracing` filter enables target `selkie::audit`
//! at level INFO (`RUST_LOG=selkie::audit=off` silences it), like any other event.

use std::{
    cell::RefCell,
    io::Write,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex, OnceLock, PoisonError,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

/// What one audit line says about a request. Strings are written JSON-escaped; none of them may
/// carry a credential (the path is the URI path only, never the query).
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditRecord<'a> {
    /// The user the request acted as (`system:anonymous` for anonymous requests, empty when the
    /// request was refused before authentication finished).
    pub user: &'a str,
    /// For nested impersonation (`kubectl --as`): who asked.
    pub original_user: &'a str,
    /// The authenticator that recognised the caller.
    pub authenticator: &'a str,
    /// The HTTP method.
    pub verb: &'a str,
    /// The URI path.
    pub path: &'a str,
    /// The status sent to the client (0 when none was).
    pub status: u16,
    /// Response body bytes sent to the client.
    pub bytes_sent: usize,
    /// Time from the request head to the end of the response, in microseconds.
    pub latency_us: u64,
    /// Why the proxy refused the request itself, if it did.
    pub refusal: &'a str,
    /// pingora's error type, if the request failed.
    pub error: &'a str,
}

/// The `target` of audit lines, as filters and log readers know it.
pub const AUDIT_TARGET: &str = "selkie::audit";

thread_local! {
    static CLOCK: RefCell<SecondCache> = RefCell::new(SecondCache::default());
    /// The line being formatted, reused for every request of the thread.
    static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(320));
}

/// Most audit lines waiting for stdout at once (a few MiB at most); more are dropped and counted.
pub const QUEUE_LINES: usize = 16_384;

/// Bytes the writer thread gathers into one `write`.
const BATCH_BYTES: usize = 64 * 1024;
/// How often the writer takes the waiting lines. A request thread only appends its line to a
/// shared buffer and wakes no one, so under load the writer wakes once per interval for a whole
/// batch: a wake-up per line (a futex and a context switch per request, on the proxy's own core)
/// cost S0 about 15 µs of CPU per request (`perf/results/issue15-after.md`). A line reaches
/// stdout at most this much later.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(10);

/// `YYYY-MM-DDTHH:MM:SS` of one Unix second, formatted once.
#[derive(Default)]
struct SecondCache {
    second: u64,
    text: [u8; 19],
    valid: bool,
}

impl SecondCache {
    fn text(&mut self, second: u64) -> &[u8; 19] {
        if !self.valid || self.second != second {
            self.text = format_second(second);
            self.second = second;
            self.valid = true;
        }
        &self.text
    }
}

/// What the request threads and the writer thread share.
struct Shared {
    state: Mutex<Pending>,
    /// Wakes the writer before its interval is over (a flush, or the end).
    wake: Condvar,
    /// Wakes flushers once a batch is written.
    written: Condvar,
    /// Lines dropped because the buffer was full.
    dropped: AtomicU64,
}

/// The lines waiting for the writer, and how far it has got.
#[derive(Default)]
struct Pending {
    /// The waiting lines, one after the other.
    buffer: Vec<u8>,
    /// How many lines `buffer` holds.
    lines: usize,
    /// Lines accepted so far, in all.
    accepted: u64,
    /// Lines written (and the sink flushed) so far, in all.
    done: u64,
    /// A flush is waiting.
    flush_requested: bool,
    /// The writer is being dropped: write what is left and end.
    closing: bool,
}

/// The handle of the writer thread.
struct Writer {
    shared: Arc<Shared>,
    capacity: usize,
}

impl Writer {
    /// Starts a writer thread that writes to `sink`, with room for `capacity` waiting lines.
    fn spawn(sink: impl Write + Send + 'static, capacity: usize) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            written: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("selkie-audit".into())
            .spawn(move || write_lines(sink, &thread_shared));
        if let Err(error) = spawned {
            tracing::error!(%error, "the audit writer thread could not start; audit lines are dropped");
        }
        Self { shared, capacity }
    }

    /// Appends `line` for the writer without ever waiting for the sink (a short lock, a copy, no
    /// allocation once the buffer has grown, no thread woken); counts it as dropped when
    /// `capacity` lines are already waiting.
    fn submit(&self, line: &[u8]) {
        let mut pending = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.lines >= self.capacity {
            drop(pending);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        pending.buffer.extend_from_slice(line);
        pending.lines += 1;
        pending.accepted += 1;
    }

    /// Waits until every line accepted before the call is written and the sink flushed, at most
    /// `timeout`. False when that did not happen in time.
    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut pending = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        let target = pending.accepted;
        pending.flush_requested = true;
        self.shared.wake.notify_one();
        while pending.done < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            pending = self
                .shared
                .written
                .wait_timeout(pending, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let mut pending = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        pending.closing = true;
        self.shared.wake.notify_one();
    }
}

/// The writer thread: every [`BATCH_INTERVAL`] (or at once for a flush), takes every waiting
/// line, writes them with one `write_all`, and reports lines dropped since the last report.
/// Ends when its [`Writer`] is dropped.
fn write_lines(mut sink: impl Write, shared: &Shared) {
    let mut batch = Vec::with_capacity(BATCH_BYTES);
    let mut reported = 0;
    loop {
        let (upto, closing) = {
            let pending = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            let (mut pending, _) = shared
                .wake
                .wait_timeout_while(pending, BATCH_INTERVAL, |pending| {
                    !pending.flush_requested && !pending.closing
                })
                .unwrap_or_else(PoisonError::into_inner);
            std::mem::swap(&mut pending.buffer, &mut batch);
            pending.lines = 0;
            pending.flush_requested = false;
            (pending.accepted, pending.closing)
        };
        if !batch.is_empty() {
            // A failed write is dropped, as tracing-subscriber drops it: the requests it
            // describes have been answered.
            let _ = sink.write_all(&batch);
            let _ = sink.flush();
            batch.clear();
        }
        {
            let mut pending = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            pending.done = upto;
        }
        shared.written.notify_all();
        let now_dropped = shared.dropped.load(Ordering::Relaxed);
        if now_dropped > reported {
            tracing::warn!(
                dropped = now_dropped - reported,
                "audit lines were dropped: stdout did not keep up"
            );
            reported = now_dropped;
        }
        if closing {
            return;
        }
    }
}

/// The process's writer, to stdout, started on first use.
fn writer() -> &'static Writer {
    static WRITER: OnceLock<Writer> = OnceLock::new();
    WRITER.get_or_init(|| Writer::spawn(std::io::stdout(), QUEUE_LINES))
}

/// Queues `record` as one line for stdout when the `tracing` filter enables audit lines. Never
/// waits for stdout: when the queue is full the line is dropped and counted (see the module
/// documentation).
pub fn emit(record: &AuditRecord<'_>) {
    if !tracing::enabled!(target: "selkie::audit", tracing::Level::INFO) {
        return;
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let date = CLOCK.with(|clock| match clock.try_borrow_mut() {
        Ok(mut clock) => *clock.text(now.as_secs()),
        // Re-entrant (impossible today: nothing here logs): format without the cache.
        Err(_) => format_second(now.as_secs()),
    });
    LINE.with(|line| match line.try_borrow_mut() {
        Ok(mut line) => {
            line.clear();
            write_line(&mut line, &date, now.subsec_micros(), record);
            writer().submit(&line);
        }
        Err(_) => {
            let mut line = Vec::with_capacity(320);
            write_line(&mut line, &date, now.subsec_micros(), record);
            writer().submit(&line);
        }
    });
}

/// Waits until every audit line emitted so far is on stdout, at most `timeout`; true when it
/// is. Called before the process exits.
pub fn flush(timeout: Duration) -> bool {
    writer().flush(timeout)
}

/// Appends the JSON line (with its newline) for `record` at the given second and microsecond.
fn write_line(out: &mut Vec<u8>, date: &[u8; 19], micros: u32, record: &AuditRecord<'_>) {
    out.extend_from_slice(b"{\"timestamp\":\"");
    out.extend_from_slice(date);
    out.push(b'.');
    push_padded(out, u64::from(micros), 6);
    out.extend_from_slice(b"Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\"");
    for (name, value) in [
        ("user", record.user),
        ("original_user", record.original_user),
        ("authenticator", record.authenticator),
        ("verb", record.verb),
        ("path", record.path),
    ] {
        push_string_field(out, name, value);
    }
    push_number_field(out, "status", u64::from(record.status));
    push_number_field(out, "bytes_sent", record.bytes_sent as u64);
    push_number_field(out, "latency_us", record.latency_us);
    push_string_field(out, "refusal", record.refusal);
    push_string_field(out, "error", record.error);
    out.extend_from_slice(b"},\"target\":\"selkie::audit\"}\n");
}

fn push_string_field(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":\"");
    push_escaped(out, value);
    out.push(b'"');
}

fn push_number_field(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
    push_padded(out, value, 1);
}

/// Appends `value` in decimal, left-padded with zeros to at least `width` digits.
fn push_padded(out: &mut Vec<u8>, mut value: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    while value > 0 || digits.len() - start < width {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
    }
    out.extend_from_slice(&digits[start..]);
}

/// Appends `value` as the inside of a JSON string: `"` and `\` escaped, control characters as
/// `\n`, `\r`, `\t` or `\u00XX`; everything else (valid UTF-8 already) as is.
fn push_escaped(out: &mut Vec<u8>, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = value.as_bytes();
    let mut clean_from = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[clean_from..index]);
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        clean_from = index + 1;
    }
    out.extend_from_slice(&bytes[clean_from..]);
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of a Unix second.
fn format_second(second: u64) -> [u8; 19] {
    let days = second / 86_400;
    let in_day = second % 86_400;
    let (year, month, day) = civil_from_days(days);
    let mut text = *b"0000-00-00T00:00:00";
    let mut put = |at: usize, value: u64, width: usize| {
        let mut value = value;
        for position in (at..at + width).rev() {
            text[position] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, year, 4);
    put(5, month, 2);
    put(8, day, 2);
    put(11, in_day / 3600, 2);
    put(14, in_day % 3600 / 60, 2);
    put(17, in_day % 60, 2);
    text
}

/// The proleptic Gregorian (year, month, day) of a day count since 1970-01-01 (days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01 so leap days end each 400-year era's years.
    let days = days + 719_468;
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{self, Receiver};

    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn line(record: &AuditRecord<'_>, second: u64, micros: u32) -> Value {
        let mut out = Vec::new();
        write_line(&mut out, &format_second(second), micros, record);
        assert_eq!(out.last(), Some(&b'\n'), "one line");
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1, "exactly one line");
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn the_line_has_the_shape_of_the_other_log_lines() {
        let record = AuditRecord {
            user: "alice@example.com",
            original_user: "",
            authenticator: "dex",
            verb: "GET",
            path: "/api/v1/namespaces/default/pods",
            status: 200,
            bytes_sent: 1024,
            latency_us: 987,
            refusal: "",
            error: "",
        };
        // 2026-11-23T00:41:12 UTC
        let value = line(&record, 1_795_394_472, 42);
        assert_eq!(value["timestamp"], "2026-11-23T00:41:12.000042Z");
        assert_eq!(value["level"], "INFO");
        assert_eq!(value["target"], "selkie::audit");
        let fields = &value["fields"];
        assert_eq!(fields["message"], "request");
        assert_eq!(fields["user"], "alice@example.com");
        assert_eq!(fields["authenticator"], "dex");
        assert_eq!(fields["verb"], "GET");
        assert_eq!(fields["path"], "/api/v1/namespaces/default/pods");
        assert_eq!(fields["status"], 200);
        assert_eq!(fields["bytes_sent"], 1024);
        assert_eq!(fields["latency_us"], 987);
        assert_eq!(fields["original_user"], "");
        assert_eq!(fields["refusal"], "");
        assert_eq!(fields["error"], "");
    }

    #[test]
    fn dates_agree_with_the_time_crate() {
        for second in [
            0u64,
            59,
            86_399,
            86_400,
            951_782_400,   // 2000-02-29
            951_868_800,   // 2000-03-01
            4_107_542_399, // 2100-02-28T23:59:59
            4_107_542_400, // 2100-03-01 (2100 is not a leap year)
            1_795_394_472,
            253_402_300_799, // 9999-12-31T23:59:59
        ] {
            let expected = time::OffsetDateTime::from_unix_timestamp(second as i64).unwrap();
            let expected = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                expected.year(),
                u8::from(expected.month()),
                expected.day(),
                expected.hour(),
                expected.minute(),
                expected.second()
            );
            assert_eq!(
                String::from_utf8(format_second(second).to_vec()).unwrap(),
                expected,
                "{second}"
            );
        }
    }

    /// A sink that takes nothing until it is opened, then keeps what it is given.
    struct Gate {
        opened: Option<Receiver<()>>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Some(opened) = self.opened.take() {
                let _ = opened.recv();
            }
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stdout_never_blocks_a_request_and_lost_lines_are_counted() {
        let (open, opened) = mpsc::channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let writer = Writer::spawn(
            Gate {
                opened: Some(opened),
                written: written.clone(),
            },
            8,
        );
        let started = Instant::now();
        for n in 0..1_000 {
            writer.submit(format!("{n}\n").as_bytes());
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "submitting waited for the stalled sink: {:?}",
            started.elapsed()
        );
        let dropped = writer.shared.dropped.load(Ordering::Relaxed);
        assert!(
            dropped >= 1_000 - 8 - 1,
            "at most the queue and one line in hand: {dropped}"
        );

        open.send(()).unwrap();
        assert!(
            writer.flush(Duration::from_secs(5)),
            "flushed once the sink moves"
        );
        let written = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let numbers: Vec<u64> = written.lines().map(|line| line.parse().unwrap()).collect();
        assert_eq!(numbers.len() as u64, 1_000 - dropped, "every accepted line, once");
        assert!(
            numbers.windows(2).all(|pair| pair[0] < pair[1]),
            "in order: {numbers:?}"
        );
    }

    #[test]
    fn flush_waits_for_the_lines_before_it() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let writer = Writer::spawn(
            Gate {
                opened: None,
                written: written.clone(),
            },
            QUEUE_LINES,
        );
        for n in 0..100 {
            writer.submit(format!("{n}\n").as_bytes());
        }
        assert!(writer.flush(Duration::from_secs(5)));
        assert_eq!(
            written.lock().unwrap().iter().filter(|&&b| b == b'\n').count(),
            100
        );
    }

    #[test]
    fn the_cached_second_follows_the_clock() {
        let mut cache = SecondCache::default();
        assert_eq!(cache.text(0), b"1970-01-01T00:00:00");
        assert_eq!(cache.text(0), b"1970-01-01T00:00:00");
        assert_eq!(cache.text(61), b"1970-01-01T00:01:01");
    }

    proptest! {
        #[test]
        fn any_strings_round_trip_through_the_line(
            user in any::<String>(),
            path in "/[\\x00-\\x7f\\u{80}-\\u{10ffff}]{0,40}",
            refusal in any::<String>(),
            status in any::<u16>(),
            bytes_sent in any::<usize>(),
            latency_us in any::<u64>(),
            micros in 0u32..1_000_000,
        ) {
            let record = AuditRecord {
                user: &user,
                path: &path,
                refusal: &refusal,
                verb: "PATCH",
                status,
                bytes_sent,
                latency_us,
                ..AuditRecord::default()
            };
            let value = line(&record, 1_795_394_472, micros);
            let fields = &value["fields"];
            prop_assert_eq!(fields["user"].as_str(), Some(user.as_str()));
            prop_assert_eq!(fields["path"].as_str(), Some(path.as_str()));
            prop_assert_eq!(fields["refusal"].as_str(), Some(refusal.as_str()));
            prop_assert_eq!(fields["status"].as_u64(), Some(u64::from(status)));
            prop_assert_eq!(fields["bytes_sent"].as_u64(), Some(bytes_sent as u64));
            prop_assert_eq!(fields["latency_us"].as_u64(), Some(latency_us));
            let expected_timestamp = format!("2026-11-23T00:41:12.{micros:06}Z");
            prop_assert_eq!(value["timestamp"].as_str(), Some(expected_timestamp.as_str()));
        }
    }
}
