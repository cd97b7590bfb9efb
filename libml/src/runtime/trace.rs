//! Request tracing: each request's way through the IF, timestamped, for
//! telling the platform's own latency from the engine's (`kp-if --trace`).
//!
//! An answer says how long the request spent in the IF (`latency_us`) and
//! the size of its batch, not how long that batch's engine call took, so a
//! benchmark that subtracts the engine's *median* time from the latency
//! attributes every slow engine call to the platform. A trace records, for
//! every request the inference thread answers, the times of its first
//! fragment, its completion (its last fragment reassembled), its batch's
//! start and end on the engine and its answer's enqueueing on the TX ring:
//! the engine's own time for that very request, and where the rest went.
//! The idea is Triton's request trace (`QUEUE_START`, `COMPUTE_START`,
//! `COMPUTE_END`, ...), kept to what the IF's two threads can record
//! without a lock, a system call or an allocation.
//!
//! The inference thread owns the [`RequestTrace`] while the IF serves:
//! recording a request is one store into a buffer allocated at start-up
//! (its pages are touched only as records arrive). When the buffer is full
//! further requests are counted, not recorded. The caller writes the
//! records out after [`super::serve`] returns ([`RequestTrace::write_jsonl`]),
//! never on the data path.
//!
//! Times are nanoseconds of the IF's monotonic clock since it began to
//! serve; the final report's `clock_realtime_ns` is that origin on the
//! realtime clock, which packet captures use. A record joins with a
//! client's or a capture's view of the same request by `(request_id,
//! send_ts_ns)` (the client's send timestamp, echoed in the answer).

use std::io::{self, Write};

use kp_wire::Status;

/// One request, answered by the inference thread: OK or INTERNAL after its
/// batch ran, or OVERLOADED when shed from the queue (then `batch` is 0 and
/// `start_ns` = `end_ns` = the time it was shed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSpan {
    /// The request's id.
    pub request_id: u64,
    /// The client's send timestamp, echoed in the answer (CLOCK_REALTIME
    /// of the client's machine): with `request_id`, the join key.
    pub send_ts_ns: u64,
    /// The client's UDP source port.
    pub src_port: u16,
    /// The answer's status (wire value).
    pub status: u8,
    /// The size of its batch (0: shed before any batch).
    pub batch: u16,
    /// The IF dequeued its first fragment.
    pub first_seen_ns: u64,
    /// The IF dequeued its last fragment: it was complete and handed to
    /// the inference thread.
    pub complete_ns: u64,
    /// Its batch started on the engine.
    pub start_ns: u64,
    /// Its batch ended.
    pub end_ns: u64,
    /// Its answer was on the TX ring (with the rest of its batch's).
    pub sent_ns: u64,
    /// Of its batch's `end_ns − start_ns`, how long the inference thread
    /// was on the CPU (its CPU clock), for an engine that computes on that
    /// thread (`Framework::runs_on_calling_thread`); 0 where not measured.
    /// The difference is time the thread was preempted (on a core shared
    /// with the fragment thread: the fragments that arrived meanwhile).
    pub batch_cpu_ns: u64,
}

impl RequestSpan {
    /// `status` as the wire value it is recorded as.
    pub fn status_value(status: Status) -> u8 {
        status as u8
    }

    /// One JSON object, the field names as above.
    fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "{{\"request_id\":{},\"send_ts_ns\":{},\"src_port\":{},\"status\":{},\"batch\":{},\
             \"first_seen_ns\":{},\"complete_ns\":{},\"start_ns\":{},\"end_ns\":{},\"sent_ns\":{},\
             \"batch_cpu_ns\":{}}}",
            self.request_id,
            self.send_ts_ns,
            self.src_port,
            self.status,
            self.batch,
            self.first_seen_ns,
            self.complete_ns,
            self.start_ns,
            self.end_ns,
            self.sent_ns,
            self.batch_cpu_ns
        )
    }
}

/// The records of one IF's run, in the order the requests were answered.
#[derive(Debug)]
pub struct RequestTrace {
    spans: Vec<RequestSpan>,
    capacity: usize,
    dropped: u64,
}

impl RequestTrace {
    /// Room for `capacity` requests, allocated now (about 64 bytes each;
    /// the memory is committed only as records are written).
    pub fn new(capacity: usize) -> Self {
        RequestTrace {
            spans: Vec::with_capacity(capacity),
            capacity,
            dropped: 0,
        }
    }

    /// Records one request; once full, counts it instead. Never allocates.
    pub fn record(&mut self, span: RequestSpan) {
        if self.spans.len() < self.capacity {
            self.spans.push(span);
        } else {
            self.dropped += 1;
        }
    }

    /// What was recorded.
    pub fn spans(&self) -> &[RequestSpan] {
        &self.spans
    }

    /// Requests answered after the buffer was full (not recorded).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Writes every record as one JSON line.
    pub fn write_jsonl(&self, out: &mut impl Write) -> io::Result<()> {
        for s in &self.spans {
            s.write_json(out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: u64) -> RequestSpan {
        RequestSpan {
            request_id: id,
            send_ts_ns: 1_700_000_000_000_000_000 + id,
            src_port: 40_000,
            status: RequestSpan::status_value(Status::Ok),
            batch: 2,
            first_seen_ns: 10,
            complete_ns: 20,
            start_ns: 30,
            end_ns: 40,
            sent_ns: 50,
            batch_cpu_ns: 35,
        }
    }

    #[test]
    fn records_up_to_its_capacity_then_counts_and_never_reallocates() {
        let mut t = RequestTrace::new(3);
        let before = t.spans.as_ptr();
        for id in 0..5 {
            t.record(span(id));
        }
        assert_eq!(t.spans().len(), 3);
        assert_eq!(t.spans()[2].request_id, 2);
        assert_eq!(t.dropped(), 2);
        assert_eq!(
            t.spans.as_ptr(),
            before,
            "the buffer moved: it was reallocated"
        );
    }

    #[test]
    fn writes_one_json_object_per_line_with_every_field() {
        let mut t = RequestTrace::new(4);
        t.record(span(7));
        t.record(RequestSpan {
            status: RequestSpan::status_value(Status::Overloaded),
            batch: 0,
            ..span(u64::MAX)
        });
        let mut out = Vec::new();
        t.write_jsonl(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        let first = &lines[0];
        assert_eq!(first["request_id"], 7);
        assert_eq!(first["send_ts_ns"], 1_700_000_000_000_000_007u64);
        assert_eq!(first["src_port"], 40_000);
        assert_eq!(first["status"], 0);
        assert_eq!(first["batch"], 2);
        for (k, v) in [
            ("first_seen_ns", 10),
            ("complete_ns", 20),
            ("start_ns", 30),
            ("end_ns", 40),
            ("sent_ns", 50),
            ("batch_cpu_ns", 35),
        ] {
            assert_eq!(first[k], v, "{k}");
        }
        assert_eq!(lines[1]["request_id"], u64::MAX);
        assert_eq!(lines[1]["status"], 4);
        assert_eq!(lines[1]["batch"], 0);
    }
}
