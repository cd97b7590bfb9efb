//! Shedding on a full IF ring without losing any request's answer.
//!
//! When an IF falls behind, its ring fills and the if-manager — which never
//! blocks on an IF — must drop fragments. Dropping them silently would break
//! docs/PROTOCOL.md's promise of exactly one answer per request: a request none of
//! whose fragments reached the IF would get no answer at all. So a request
//! that loses a fragment is *shed* instead:
//!
//! 1. its first fragment that finds no room becomes the request's **shed
//!    notice**: one byte of the frame is rewritten in place
//!    ([`kp_wire::mark_shed_notice`]) and the mbuf goes on the IF's ring
//!    after every fragment of the request already there;
//! 2. the request is remembered here for the answered-table time-to-live, and
//!    its later fragments are dropped ([`Outcome::ShedSuppressed`]), even once
//!    the ring has room again;
//! 3. the IF, on the notice, answers the request OVERLOADED — once: if it
//!    already answered it (or handed it to inference) it stays silent
//!    (`libml::reassembly::Reassembler::on_shed_notice`).
//!
//! Notices must not be dropped in turn, so they do not compete with data for
//! the ring: [`shed_headroom`] slots of every ring are kept free of data, and
//! a notice that still finds no room waits in a bounded per-IF queue here,
//! flushed before any data of that IF (and every clock tick), so it reaches
//! the IF as soon as the IF dequeues anything. While notices wait, all of
//! that IF's data is shed. A notice that arrives late is harmless: if the IF
//! meanwhile answered the request INCOMPLETE, the notice is `Late` there.
//!
//! Only when that queue is full too ([`PENDING_PER_IF`] requests shed while
//! the IF dequeued nothing) is a fragment lost without a notice, counted as
//! [`Outcome::RingFull`]; the request is not remembered, so its next
//! fragment tries again.

use std::collections::VecDeque;

use dpdk::{Mbuf, Ring};
use kp_wire::answered::{Answer, AnsweredTable};
use kp_wire::{IfId, RequestKey};

use crate::classify::{classify, DstFilter, Verdict};
use crate::outcome::{bump, Counters, Outcome};
use crate::routes::RouteTable;

/// Shed notices that may wait for ring room, per IF.
pub const PENDING_PER_IF: usize = 4096;

/// Slots of an IF ring of `capacity` kept free of data for shed notices:
/// an eighth, at least one.
pub fn shed_headroom(capacity: usize) -> usize {
    (capacity / 8).max(1)
}

/// The shed requests and the notices waiting for room (owned by the RX
/// loop).
#[derive(Debug)]
pub struct Shedder {
    table: AnsweredTable,
    ttl_ns: u64,
    /// Until when a fragment may belong to a remembered shed request (no
    /// lookup at all while nothing was shed for a time-to-live).
    active_until_ns: u64,
    pending: Vec<(IfId, VecDeque<Mbuf>)>,
    pending_total: usize,
}

impl Shedder {
    /// Remembers up to `capacity` shed requests for `ttl_ns` each.
    pub fn new(capacity: usize, ttl_ns: u64) -> Self {
        Shedder {
            table: AnsweredTable::new(capacity, ttl_ns),
            ttl_ns,
            active_until_ns: 0,
            pending: Vec::new(),
            pending_total: 0,
        }
    }

    /// Whether a fragment of request `key` is to be dropped because its
    /// request was shed. One comparison while nothing was shed recently.
    #[inline]
    pub fn suppresses(&self, key: &RequestKey, now_ns: u64) -> bool {
        now_ns < self.active_until_ns && self.table.contains(key, now_ns)
    }

    /// Notices waiting for room, over all IFs.
    pub fn pending(&self) -> usize {
        self.pending_total
    }

    /// Moves `if_id`'s waiting notices onto its ring, oldest first; true if
    /// none is left waiting (data may go on the ring).
    #[inline]
    pub fn flush(&mut self, if_id: IfId, ring: &Ring) -> bool {
        if self.pending_total == 0 {
            return true;
        }
        let Some(q) = self.queue_mut(if_id) else {
            return true;
        };
        let before = q.len();
        while let Some(m) = q.pop_front() {
            if let Err(m) = ring.enqueue(m) {
                q.push_front(m);
                break;
            }
        }
        let left = q.len();
        self.pending_total -= before - left;
        left == 0
    }

    /// Flushes every IF's waiting notices; those of IFs no longer routed
    /// are freed and counted in `notices_dropped`.
    pub fn flush_all(&mut self, routes: &RouteTable<Ring>, counters: &Counters) {
        let ids: Vec<IfId> = self
            .pending
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            match routes.get(id) {
                Some(route) => {
                    self.flush(id, &route.ring);
                }
                None => self.drop_pending(id, counters),
            }
        }
    }

    /// Frees every waiting notice (at shutdown), counted.
    pub fn clear(&mut self, counters: &Counters) {
        let ids: Vec<IfId> = self.pending.iter().map(|(id, _)| *id).collect();
        for id in ids {
            self.drop_pending(id, counters);
        }
    }

    /// Sheds `mbuf`, a fragment for `if_id` that found no room for data on
    /// `ring`; returns its outcome (see the module doc).
    pub fn shed(
        &mut self,
        if_id: IfId,
        ring: &Ring,
        filter: &DstFilter,
        counters: &Counters,
        mut mbuf: Mbuf,
        now_ns: u64,
    ) -> Outcome {
        // Classified once already; again here, on the slow path only.
        let Verdict::Fragment { addr, header } = classify(mbuf.data(), filter) else {
            return Outcome::RingFull;
        };
        let key = RequestKey {
            src_ip: addr.src_ip,
            src_port: addr.src_port,
            if_id: header.if_id,
            request_id: header.request_id,
        };
        if self.table.contains(&key, now_ns) {
            return Outcome::ShedSuppressed;
        }
        let waiting = self.queue_len(if_id);
        if waiting >= PENDING_PER_IF {
            return Outcome::RingFull;
        }
        let at = addr.header_len();
        if !kp_wire::mark_shed_notice(&mut mbuf.data_mut()[at..]) {
            return Outcome::RingFull;
        }
        if let Answer::Now { evicted_live: true } = self.table.first_answer(&key, now_ns) {
            bump(&counters.answered_evictions, 1);
        }
        self.active_until_ns = now_ns.saturating_add(self.ttl_ns);
        // Behind any notice already waiting, to keep them in order.
        let mbuf = if waiting == 0 {
            match ring.enqueue(mbuf) {
                Ok(()) => return Outcome::Shed,
                Err(m) => m,
            }
        } else {
            mbuf
        };
        self.queue_or_insert(if_id).push_back(mbuf);
        self.pending_total += 1;
        Outcome::Shed
    }

    fn queue_mut(&mut self, if_id: IfId) -> Option<&mut VecDeque<Mbuf>> {
        self.pending
            .iter_mut()
            .find(|(id, _)| *id == if_id)
            .map(|(_, q)| q)
    }

    fn queue_len(&self, if_id: IfId) -> usize {
        if self.pending_total == 0 {
            return 0;
        }
        self.pending
            .iter()
            .find(|(id, _)| *id == if_id)
            .map_or(0, |(_, q)| q.len())
    }

    fn queue_or_insert(&mut self, if_id: IfId) -> &mut VecDeque<Mbuf> {
        let i = match self.pending.iter().position(|(id, _)| *id == if_id) {
            Some(i) => i,
            None => {
                self.pending.push((if_id, VecDeque::new()));
                self.pending.len() - 1
            }
        };
        &mut self.pending[i].1
    }

    fn drop_pending(&mut self, if_id: IfId, counters: &Counters) {
        if let Some(q) = self.queue_mut(if_id) {
            let n = q.len();
            q.clear();
            self.pending_total -= n;
            bump(&counters.notices_dropped, n as u64);
        }
    }
}
