//! The request book: which requests are outstanding, which answer belongs
//! to which, what timed out, and what every received datagram was.
//!
//! Sans-IO (time is an argument, bytes come in as slices), so it is tested
//! without sockets; [`Client`](crate::Client) keeps one behind a mutex.
//!
//! Every request ends exactly once, in one of: its first well-formed,
//! matching answer (same request_id, if_id and echoed send_ts_ns), a
//! timeout, or a client-side failure (unreachable, a failed send). Its
//! result is then held until collected once, by `take` (for
//! [`Client::wait`](crate::Client::wait)) or `take_ready` (for
//! [`Client::poll`](crate::Client::poll)). Every datagram received ends in
//! exactly one counter: `answered`, `duplicates` (another answer to an
//! answered request), `late` (an answer to a request that had already timed
//! out or failed), `unexpected` (matching no request of this client's) or
//! `malformed` (not a well-formed response per kp-wire's
//! `Response::new_checked`). Nothing is delivered twice and nothing panics,
//! whatever the bytes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use kp_wire::{Response, Status};

use crate::{Answer, Class, ClientError, Reply, RequestId};

/// How many recently finished request ids are remembered to tell a
/// duplicate or late answer from an unexpected one (direct-mapped by id;
/// only the counters depend on it).
const RECENT: usize = 4096;

/// Counters of a client, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests submitted (fragments sent).
    pub submitted: u64,
    /// Requests that got an answer (OK or an error status).
    pub answered: u64,
    /// Requests that timed out.
    pub timed_out: u64,
    /// Requests failed as unreachable.
    pub unreachable: u64,
    /// Datagrams that answered an already answered request (dropped).
    pub duplicates: u64,
    /// Answers to requests that had timed out or failed (dropped).
    pub late: u64,
    /// Well-formed answers matching no request of this client (unknown
    /// request_id, or its if_id / echoed send_ts_ns differ; dropped).
    pub unexpected: u64,
    /// Datagrams that are not well-formed responses (dropped).
    pub malformed: u64,
}

/// What one received datagram was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// The first answer of an outstanding request, with its status.
    Answer(RequestId, Status),
    /// Another answer to an answered request.
    Duplicate,
    /// An answer to a request that had already ended otherwise.
    Late,
    /// Matches no request.
    Unexpected,
    /// Not a well-formed response.
    Malformed,
}

#[derive(Debug)]
struct Pending {
    if_id: u16,
    send_ts_ns: u64,
    sent_at: Instant,
    timeout: Duration,
    pollable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Answered,
    Otherwise,
}

/// See the module docs.
#[derive(Debug)]
pub struct Book {
    pending: HashMap<u64, Pending>,
    /// (deadline, id) of pending requests, soonest first; entries of
    /// requests that ended otherwise are skipped when they surface.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    done: HashMap<u64, Result<Answer, ClientError>>,
    /// Pollable requests that ended, in the order they did; ids already
    /// collected by `take` are skipped.
    ready: VecDeque<u64>,
    recent: Box<[Option<(u64, Ended)>]>,
    /// How each answered request's answer came (any status), until its
    /// result is collected.
    replies: HashMap<u64, Reply>,
    stats: Stats,
}

impl Default for Book {
    fn default() -> Self {
        Book::new()
    }
}

impl Book {
    /// An empty book.
    pub fn new() -> Book {
        Book {
            pending: HashMap::new(),
            deadlines: BinaryHeap::new(),
            done: HashMap::new(),
            ready: VecDeque::new(),
            recent: vec![None; RECENT].into_boxed_slice(),
            replies: HashMap::new(),
            stats: Stats::default(),
        }
    }

    /// Records request `id` as sent at `now`. `pollable`: its result goes
    /// to `take_ready` (else only `take` collects it).
    pub fn insert(
        &mut self,
        id: u64,
        if_id: u16,
        send_ts_ns: u64,
        now: Instant,
        timeout: Duration,
        pollable: bool,
    ) {
        self.pending.insert(
            id,
            Pending {
                if_id,
                send_ts_ns,
                sent_at: now,
                timeout,
                pollable,
            },
        );
        self.deadlines.push(Reverse((now + timeout, id)));
        self.stats.submitted += 1;
    }

    /// Accounts for one datagram received at `now`.
    pub fn received(&mut self, datagram: &[u8], now: Instant) -> Received {
        let Ok(r) = Response::new_checked(datagram) else {
            self.stats.malformed += 1;
            return Received::Malformed;
        };
        let id = r.request_id();
        let Some(p) = self.pending.get(&id) else {
            let ended = self.recent[slot(id)].filter(|(i, _)| *i == id).map(|e| e.1);
            return match ended {
                Some(Ended::Answered) => {
                    self.stats.duplicates += 1;
                    Received::Duplicate
                }
                Some(Ended::Otherwise) => {
                    self.stats.late += 1;
                    Received::Late
                }
                None => {
                    self.stats.unexpected += 1;
                    Received::Unexpected
                }
            };
        };
        if r.if_id().0 != p.if_id || r.send_ts_ns() != p.send_ts_ns {
            self.stats.unexpected += 1;
            return Received::Unexpected;
        }
        let status = r.status();
        let result = match ClientError::from_status(status, p.if_id) {
            Some(e) => Err(e),
            None => Ok(Answer {
                request_id: RequestId(id),
                if_id: p.if_id,
                top_k: r
                    .results()
                    .map(|(class, score)| Class { class, score })
                    .collect(),
                batch_size: r.batch_size(),
                platform_latency_us: r.latency_us(),
                rtt: now.saturating_duration_since(p.sent_at),
            }),
        };
        self.replies.insert(
            id,
            Reply {
                status,
                batch_size: r.batch_size(),
                platform_latency_us: r.latency_us(),
                sent_at: p.sent_at,
                received_at: now,
            },
        );
        self.stats.answered += 1;
        self.end(id, Ended::Answered, result);
        Received::Answer(RequestId(id), status)
    }

    /// Ends every request whose timeout has passed at `now` with
    /// [`ClientError::Timeout`]; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            // Not pending any more (answered), or re-inserted under a new
            // deadline: nothing to do for this entry.
            let Some(p) = self.pending.get(&id) else {
                continue;
            };
            if p.sent_at + p.timeout != deadline {
                continue;
            }
            let timeout = p.timeout;
            self.stats.timed_out += 1;
            self.end(id, Ended::Otherwise, Err(ClientError::Timeout(timeout)));
            n += 1;
        }
        n
    }

    /// The soonest deadline of a pending request, if any.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            match self.pending.get(&id) {
                Some(p) if p.sent_at + p.timeout == deadline => return Some(deadline),
                _ => {
                    self.deadlines.pop();
                }
            }
        }
        None
    }

    /// Request `id`'s deadline, if it is pending.
    pub fn deadline_of(&self, id: u64) -> Option<Instant> {
        self.pending.get(&id).map(|p| p.sent_at + p.timeout)
    }

    /// Ends every pending request with [`ClientError::Unreachable`];
    /// returns how many.
    pub fn fail_all_unreachable(&mut self) -> usize {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for &id in &ids {
            self.stats.unreachable += 1;
            self.end(id, Ended::Otherwise, Err(ClientError::Unreachable));
        }
        ids.len()
    }

    /// Forgets request `id` (its sending failed; the caller reports that
    /// error instead): an answer that still comes counts as late.
    pub fn forget(&mut self, id: u64) {
        if self.pending.remove(&id).is_some() {
            self.stats.submitted -= 1;
        }
        self.done.remove(&id);
        self.replies.remove(&id);
        self.recent[slot(id)] = Some((id, Ended::Otherwise));
    }

    /// Whether request `id` is outstanding (no result yet).
    #[cfg(test)]
    pub fn is_pending(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
    }

    /// Request `id`'s result, once, if it has one.
    pub fn take(&mut self, id: u64) -> Option<Result<Answer, ClientError>> {
        self.replies.remove(&id);
        self.done.remove(&id)
    }

    /// The results of every pollable request that ended and was not
    /// collected yet, in the order they ended.
    pub fn take_ready(&mut self) -> Vec<(RequestId, Result<Answer, ClientError>)> {
        self.take_ready_replies()
            .into_iter()
            .map(|(id, r, _)| (id, r))
            .collect()
    }

    /// [`take_ready`](Self::take_ready), each result with how its answer
    /// came (`None`: it ended without one: timeout, unreachable).
    #[allow(clippy::type_complexity)]
    pub fn take_ready_replies(
        &mut self,
    ) -> Vec<(RequestId, Result<Answer, ClientError>, Option<Reply>)> {
        let mut out = Vec::with_capacity(self.ready.len());
        while let Some(id) = self.ready.pop_front() {
            if let Some(r) = self.done.remove(&id) {
                out.push((RequestId(id), r, self.replies.remove(&id)));
            }
        }
        out
    }

    /// Whether a pollable result is waiting (maybe one `take` collected
    /// since: then `take_ready` returns fewer).
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Requests outstanding (no result yet).
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn end(&mut self, id: u64, how: Ended, result: Result<Answer, ClientError>) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        self.recent[slot(id)] = Some((id, how));
        if p.pollable {
            self.ready.push_back(id);
        }
        self.done.insert(id, result);
    }
}

fn slot(id: u64) -> usize {
    (id % RECENT as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_wire::{IfId, MsgType, ResponseRepr};

    pub(crate) fn answer(id: u64, if_id: u16, ts: u64, status: Status) -> Vec<u8> {
        let results = [(967u32, 0.75f32), (504, 0.125)];
        let repr = if status == Status::Ok {
            ResponseRepr {
                msg_type: MsgType::Response,
                if_id: IfId(if_id),
                request_id: id,
                send_ts_ns: ts,
                status,
                batch_size: 4,
                latency_us: 250,
                results: &results,
            }
        } else {
            ResponseRepr::error(IfId(if_id), id, ts, status, 9)
        };
        let mut buf = vec![0u8; repr.wire_len()];
        repr.emit(&mut buf).unwrap();
        buf
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn answers_match_by_id_if_id_and_echoed_timestamp() {
        let t0 = Instant::now();
        let mut b = Book::new();
        b.insert(10, 7, 1000, t0, 50 * MS, false);
        b.insert(11, 7, 1001, t0, 50 * MS, false);
        // Right id, wrong if_id or timestamp: not its answer.
        assert_eq!(
            b.received(&answer(10, 8, 1000, Status::Ok), t0),
            Received::Unexpected
        );
        assert_eq!(
            b.received(&answer(10, 7, 999, Status::Ok), t0),
            Received::Unexpected
        );
        assert_eq!(
            b.received(&answer(12, 7, 1002, Status::Ok), t0),
            Received::Unexpected
        );
        assert!(b.take(10).is_none() && b.is_pending(10));
        assert_eq!(
            b.received(&answer(11, 7, 1001, Status::Ok), t0 + 3 * MS),
            Received::Answer(RequestId(11), Status::Ok)
        );
        let a = b.take(11).unwrap().unwrap();
        assert_eq!(a.request_id, RequestId(11));
        assert_eq!(a.rtt, 3 * MS);
        assert_eq!((a.batch_size, a.platform_latency_us), (4, 250));
        assert_eq!(
            a.top_k,
            vec![
                Class {
                    class: 967,
                    score: 0.75
                },
                Class {
                    class: 504,
                    score: 0.125
                }
            ]
        );
        assert!(b.take(11).is_none(), "a result is collected once");
        assert_eq!(b.outstanding(), 1);
    }

    #[test]
    fn every_error_status_is_its_own_error() {
        let t0 = Instant::now();
        let mut b = Book::new();
        for (i, s) in Status::ALL.iter().enumerate() {
            let id = i as u64;
            b.insert(id, 3, id, t0, MS, false);
            assert_eq!(
                b.received(&answer(id, 3, id, *s), t0),
                Received::Answer(RequestId(id), *s)
            );
            let r = b.take(id).unwrap();
            match s {
                Status::Ok => assert!(r.is_ok()),
                _ => assert_eq!(r.unwrap_err().status(), Some(*s)),
            }
        }
        b.insert(99, 3, 99, t0, MS, false);
        b.received(&answer(99, 3, 99, Status::UnknownIf), t0);
        assert!(matches!(
            b.take(99),
            Some(Err(ClientError::UnknownIf { if_id: 3 }))
        ));
    }

    #[test]
    fn a_duplicate_answer_is_dropped_and_counted() {
        let t0 = Instant::now();
        let mut b = Book::new();
        b.insert(5, 1, 5, t0, MS, true);
        let ok = answer(5, 1, 5, Status::Ok);
        assert!(matches!(b.received(&ok, t0), Received::Answer(..)));
        assert_eq!(b.received(&ok, t0), Received::Duplicate);
        // Even a duplicate that says something else.
        assert_eq!(
            b.received(&answer(5, 1, 5, Status::Internal), t0),
            Received::Duplicate
        );
        let got = b.take_ready();
        assert_eq!(got.len(), 1);
        assert!(got[0].1.is_ok());
        assert_eq!(b.received(&ok, t0), Received::Duplicate);
        assert!(b.take_ready().is_empty() && b.take(5).is_none());
        assert_eq!(b.stats().duplicates, 3);
        assert_eq!(b.stats().answered, 1);
    }

    #[test]
    fn timeouts_end_requests_and_later_answers_are_late() {
        let t0 = Instant::now();
        let mut b = Book::new();
        b.insert(1, 1, 1, t0, 10 * MS, true);
        b.insert(2, 1, 2, t0, 30 * MS, true);
        b.insert(3, 1, 3, t0 + MS, 5 * MS, true);
        assert_eq!(b.next_deadline(), Some(t0 + 6 * MS));
        assert_eq!(b.expire(t0 + 5 * MS), 0);
        assert_eq!(b.expire(t0 + 6 * MS), 1, "3 times out first");
        assert_eq!(b.expire(t0 + 10 * MS), 1, "then 1");
        assert_eq!(b.next_deadline(), Some(t0 + 30 * MS));
        assert_eq!(
            b.received(&answer(1, 1, 1, Status::Ok), t0 + 11 * MS),
            Received::Late
        );
        let got = b.take_ready();
        let ids: Vec<u64> = got.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, vec![3, 1]);
        assert!(got
            .iter()
            .all(|(_, r)| matches!(r, Err(ClientError::Timeout(_)))));
        assert!(matches!(
            b.received(&answer(2, 1, 2, Status::Ok), t0 + 12 * MS),
            Received::Answer(..)
        ));
        assert_eq!(b.expire(t0 + 100 * MS), 0, "2 was answered");
        assert_eq!(b.next_deadline(), None);
        let s = b.stats();
        assert_eq!((s.submitted, s.answered, s.timed_out, s.late), (3, 1, 2, 1));
    }

    #[test]
    fn malformed_datagrams_are_counted_never_a_panic() {
        let t0 = Instant::now();
        let mut b = Book::new();
        b.insert(1, 1, 1, t0, MS, false);
        let good = answer(1, 1, 1, Status::Ok);
        let mut bad: Vec<Vec<u8>> = vec![
            vec![],
            b"KNPT".to_vec(),
            good[..35].to_vec(),
            good[..good.len() - 1].to_vec(),
            [&good[..], &[0]].concat(),
        ];
        for (at, v) in [(0, 0u8), (4, 2), (5, 1), (5, 9), (27, 6)] {
            let mut d = good.clone();
            d[at] = v;
            bad.push(d);
        }
        // Every prefix of a good answer, and every flip of a byte that
        // checks or identifies it (magic to k; batch size, latency and
        // scores may be anything).
        for n in 0..good.len() {
            bad.push(good[..n].to_vec());
        }
        for i in 0..30 {
            let mut d = good.clone();
            d[i] ^= 0xFF;
            bad.push(d);
        }
        for d in &bad {
            let r = b.received(d, t0);
            assert!(
                matches!(r, Received::Malformed | Received::Unexpected),
                "{r:?} for {d:?}"
            );
        }
        assert!(b.is_pending(1), "garbage answered nothing");
        assert!(b.stats().malformed >= 10);
        assert!(matches!(b.received(&good, t0), Received::Answer(..)));
    }

    #[test]
    fn unreachable_fails_what_is_pending_and_forget_makes_answers_late() {
        let t0 = Instant::now();
        let mut b = Book::new();
        b.insert(1, 1, 1, t0, MS, false);
        b.insert(2, 1, 2, t0, MS, false);
        b.forget(2);
        assert_eq!(b.fail_all_unreachable(), 1);
        assert!(matches!(b.take(1), Some(Err(ClientError::Unreachable))));
        assert!(b.take(2).is_none());
        assert_eq!(b.received(&answer(2, 1, 2, Status::Ok), t0), Received::Late);
        assert_eq!(b.stats().submitted, 1);
    }
}
