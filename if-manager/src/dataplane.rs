//! The poll loop: RX, classify, route, answer unknown IFs, TX.
//!
//! One thread (the EAL main lcore, pinned by DPDK) runs [`run`]. Each
//! iteration it
//! 1. takes a burst of up to [`RX_BURST`] frames off the RX queue;
//! 2. classifies each ([`crate::classify`]) and gives it exactly one
//!    [`Outcome`]: consecutive fragments for the same IF are staged and
//!    enqueued on that IF's ring in one burst, the mbuf itself, no copy;
//!    when the ring is nearly full, a request's first fragment that does
//!    not fit becomes its *shed notice* (the IF answers OVERLOADED) and the
//!    rest of it is dropped ([`crate::shed`]), so even a request none of
//!    whose fragments got through is answered exactly once;
//! 3. turns the first fragment of a request for an unregistered `if_id` into
//!    its UNKNOWN_IF error *in the same mbuf* (rewritten in place, so the
//!    error path allocates nothing);
//! 4. moves finished response frames from the shared TX ring to the NIC,
//!    keeping what the NIC refused for a bounded number of retries before
//!    freeing it (counted) — never leaking an mbuf.
//!
//! Idle, it backs off (`libml::backoff`); where the back-off says sleep, it
//! dozes on the TX ring's doorbell (`TxBell`) for that long instead, so an
//! answer an IF enqueues leaves at once while received packets wait for
//! the end of the doze at most, as they did for the sleep. While a request's
//! tail is arriving and no IF runs a batch, those dozes are exact (timer slack
//! 1 µs, `libml::backoff::sleep_slack`): the request's engine waits for its
//! last fragment; otherwise they keep the thread's slack.
//!
//! The clock is read every [`CLOCK_EVERY`] iterations (and after every
//! sleep), not per packet; route updates and the stop flag are checked at
//! the same ticks, and the port's counters are read and published for the
//! control thread at the first tick after each [`PORT_STATS_EVERY`]
//! ([`crate::port_stats`] says why here).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{Mbuf, MbufBurst, Port, QueueId, Ring};
use kp_wire::{
    FragmentRepr, FrameAddr, RequestKey, ResponseRepr, Status, ETH_HDR_LEN, RESPONSE_HEADER_LEN,
    UDP_HDR_LEN, VLAN_TAG_LEN,
};

use crate::classify::{classify, DstFilter, Verdict};
use crate::control::Gate;
use crate::outcome::{bump, Counters, MalformedReason, Outcome};
use crate::port_stats::PORT_STATS_EVERY;
use crate::routes::{RouteChange, RouteTable};
use crate::shed::{shed_headroom, wakes_the_if, Shedder, Staged};
use kp_wire::answered::{Answer, AnsweredTable};
use libml::backoff::{
    doze_before_answers, sleep_slack, ArrivalWatch, IdleAction, IdleBackoff, IdleWait,
};
use libml::runtime::handover::TxBell;

/// Frames per RX burst (DPDK's customary 32: enough to amortise the PMD
/// call, small enough to stay in L1).
pub const RX_BURST: usize = 32;
/// Capacity of the pending-TX burst: responses from IFs plus our errors.
pub const TX_PENDING: usize = 128;
/// Iterations between clock reads / control checks.
pub const CLOCK_EVERY: u32 = 64;
/// Consecutive TX attempts without progress before pending frames are
/// dropped (a NIC that takes nothing for this long is down or wedged).
pub const TX_MAX_STALLS: u32 = 1024;

/// Everything the loop needs, owned or borrowed.
#[derive(Debug)]
pub struct DataPlane<'a> {
    /// The port, with one RX and one TX queue.
    pub port: &'a Port,
    /// The shared ring IFs put their response frames on.
    pub tx_ring: &'a Ring,
    /// Its doorbell, which IFs ring when they enqueue: where the back-off
    /// says sleep, the loop dozes on it instead, so answers leave at once.
    pub tx_bell: &'a TxBell,
    /// Routing table (owned by this loop).
    pub routes: RouteTable<Ring>,
    /// Which datagrams are ours.
    pub filter: DstFilter,
    /// Requests answered UNKNOWN_IF recently.
    pub answered: AnsweredTable,
    /// Requests shed on a full ring, and their notices waiting for room.
    pub shedder: Shedder,
    /// Counters (this loop is their only writer).
    pub counters: Arc<Counters>,
    /// Set by a signal or the control socket to stop the loop.
    pub stop: Arc<AtomicBool>,
    /// Exit after this long without RX or TX activity.
    pub exit_when_idle: Option<Duration>,
    /// Back-off policy when idle.
    pub backoff: IdleBackoff,
    /// RX gate and live-IF count, set by the control side.
    pub gate: Arc<Gate>,
}

/// Why the loop returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// SIGINT/SIGTERM or a control `shutdown`.
    Stopped,
    /// `--exit-when-idle` elapsed.
    Idle,
}

impl StopReason {
    /// Name in the final report.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Stopped => "stopped",
            StopReason::Idle => "idle",
        }
    }
}

const Q0: QueueId = QueueId(0);

impl DataPlane<'_> {
    /// Runs until stopped; returns why.
    pub fn run(&mut self) -> StopReason {
        let start = Instant::now();
        let mut rx = MbufBurst::<RX_BURST>::new();
        let mut staged = MbufBurst::<RX_BURST>::new();
        // What classification found for each staged mbuf, in the same order.
        let mut staged_info = [Staged::default(); RX_BURST];
        let mut tx = MbufBurst::<TX_PENDING>::new();
        let mut now_ns = 0u64;
        let mut last_activity = start;
        let mut active_since_tick = false;
        let mut iter = 0u32;
        let mut tx_stalls = 0u32;
        let mut rx_open = self.gate.rx_open.load(Ordering::Acquire);
        self.counters.port.publish(&self.port.stats());
        let mut next_port_stats = start + PORT_STATS_EVERY;
        // Exact sleeps while a request's tail arrives for an idle engine, the
        // thread's own slack otherwise (`libml::backoff::sleep_slack`).
        let mut arrivals = ArrivalWatch::default();
        let base_slack = kp_os::priority::timer_slack_current_thread();
        let mut slack = base_slack;
        loop {
            iter = iter.wrapping_add(1);
            if iter.is_multiple_of(CLOCK_EVERY) || self.backoff.is_sleeping() {
                let now = Instant::now();
                now_ns = now.duration_since(start).as_nanos() as u64;
                if active_since_tick {
                    last_activity = now;
                    active_since_tick = false;
                }
                if now >= next_port_stats {
                    self.counters.port.publish(&self.port.stats());
                    next_port_stats = now + PORT_STATS_EVERY;
                }
                // Gate first, routes second: an IF registers before it says
                // ready, so once the gate reads open its route is applied.
                rx_open = self.gate.rx_open.load(Ordering::Acquire);
                self.apply_route_updates();
                if self.shedder.pending() > 0 {
                    self.shedder.flush_all(&self.routes);
                }
                if self.stop.load(Ordering::Relaxed) {
                    self.shedder.clear(&self.counters);
                    self.flush_tx(&mut tx);
                    return StopReason::Stopped;
                }
                if let Some(idle) = self.exit_when_idle {
                    if rx_open
                        && tx.is_empty()
                        && self.tx_ring.count() == 0
                        && self.shedder.pending() == 0
                        && self.gate.live_ifs.load(Ordering::Relaxed) == 0
                        && now.duration_since(last_activity) >= idle
                    {
                        return StopReason::Idle;
                    }
                }
            }

            let got = if rx_open {
                self.port.rx_burst(Q0, &mut rx)
            } else {
                0
            };
            if got > 0 {
                bump(&self.counters.rx_packets, got as u64);
                if let Some(remaining) =
                    self.handle_burst(&mut rx, &mut staged, &mut staged_info, &mut tx, now_ns)
                {
                    arrivals.fragment(now_ns, remaining);
                }
            }

            // Responses from IFs, then everything pending, to the NIC.
            let from_ifs = self.tx_ring.dequeue_burst(&mut tx);
            bump(&self.counters.tx_from_ifs, from_ifs as u64);
            let mut sent = 0;
            if !tx.is_empty() {
                sent = self.port.tx_burst(Q0, &mut tx);
                bump(&self.counters.tx_sent, sent as u64);
                if sent == 0 {
                    tx_stalls += 1;
                    if tx_stalls >= TX_MAX_STALLS {
                        bump(&self.counters.tx_dropped, tx.len() as u64);
                        tx.clear();
                        tx_stalls = 0;
                    }
                } else {
                    tx_stalls = 0;
                }
            }

            let did_work = got > 0 || from_ifs > 0 || sent > 0;
            active_since_tick |= did_work;
            match self.backoff.after_poll(did_work) {
                IdleAction::Poll => {}
                IdleAction::Pause => std::hint::spin_loop(),
                IdleAction::Sleep(d) => {
                    // The bell's count first, then the ring: an answer
                    // enqueued before is sent at the next poll, one after
                    // rings past `rung` and ends the doze at once.
                    let bell = self.tx_bell.doorbell();
                    let rung = bell.seen();
                    if self.tx_ring.count() == 0 {
                        // Polling, not dozing, when an IF's answers are due.
                        let now = kp_os::affinity::monotonic_ns();
                        match doze_before_answers(d, now, self.routes.answer_windows()) {
                            IdleWait::Doze(d) => {
                                // The routes' windows are read again only
                                // where it matters: a request arriving.
                                let arriving = arrivals.arriving(now_ns);
                                let busy =
                                    arriving && self.routes.answer_windows().next().is_some();
                                let want = sleep_slack(arriving, busy, base_slack);
                                // A failed prctl leaves the slack as it was:
                                // a sleep up to 50 µs late, nothing lost.
                                if want != slack
                                    && kp_os::priority::set_timer_slack_current_thread(want).is_ok()
                                {
                                    slack = want;
                                }
                                bell.doze(rung, d)
                            }
                            IdleWait::Poll => std::hint::spin_loop(),
                        }
                    }
                }
            }
        }
    }

    /// Applies the control side's route changes; an IF's notice queue is
    /// made (or dropped) with its route.
    pub fn apply_route_updates(&mut self) -> usize {
        let (shedder, counters) = (&mut self.shedder, &self.counters);
        self.routes.apply_updates(|change| match change {
            RouteChange::Added(id) => shedder.prepare(id),
            RouteChange::Removed(id) => shedder.forget(id, counters),
        })
    }

    /// Gives every frame of `rx` its outcome; returns, if it routed a
    /// fragment to an IF, how many fragments the latest of them came before
    /// its request's last (for the [`ArrivalWatch`]).
    fn handle_burst(
        &mut self,
        rx: &mut MbufBurst<RX_BURST>,
        staged: &mut MbufBurst<RX_BURST>,
        staged_info: &mut [Staged; RX_BURST],
        tx: &mut MbufBurst<TX_PENDING>,
        now_ns: u64,
    ) -> Option<u16> {
        let mut latest_remaining = None;
        let mut staged_for = None;
        // Whether a staged fragment is the first or the last of its
        // request: the IF is woken for those (see `enqueue_staged`).
        let mut staged_edge = false;
        for mut mbuf in rx.drain() {
            if mbuf.is_segmented() {
                self.counters.record_malformed(MalformedReason::Segmented);
                continue; // dropping the Mbuf frees it
            }
            match classify(mbuf.data(), &self.filter) {
                Verdict::NotForUs(reason) => self.counters.record_not_for_us(reason),
                Verdict::Malformed(reason) => self.counters.record_malformed(reason),
                Verdict::Fragment {
                    addr,
                    header,
                    header_at,
                } => {
                    if let Some(route) = self.routes.get(header.if_id) {
                        let key = RequestKey {
                            src_ip: addr.src_ip,
                            src_port: addr.src_port,
                            if_id: header.if_id,
                            request_id: header.request_id,
                        };
                        if self.shedder.suppresses(&key, now_ns) {
                            bump(&route.counters.shed_suppressed, 1);
                            self.counters.record(Outcome::ShedSuppressed);
                            continue;
                        }
                        if staged_for != Some(header.if_id) {
                            if let Some(prev) = staged_for {
                                self.enqueue_staged(prev, staged, staged_info, staged_edge, now_ns);
                            }
                            staged_for = Some(header.if_id);
                            staged_edge = false;
                        }
                        let remaining = header
                            .frag_count
                            .saturating_sub(header.frag_index.wrapping_add(1));
                        staged_edge |= header.frag_index == 0 || remaining == 0;
                        latest_remaining = Some(remaining);
                        staged_info[staged.len()] = Staged { key, header_at };
                        // What we validated, for the IF: it reads the
                        // headers at these offsets without parsing again.
                        let l2 = if addr.vlan_tci.is_some() {
                            ETH_HDR_LEN + VLAN_TAG_LEN
                        } else {
                            ETH_HDR_LEN
                        };
                        mbuf.set_header_lens(l2, header_at - l2 - UDP_HDR_LEN);
                        staged.push(mbuf);
                    } else {
                        self.answer_unknown_if(mbuf, &addr, &header, tx, now_ns);
                    }
                }
            }
        }
        if let Some(prev) = staged_for {
            self.enqueue_staged(prev, staged, staged_info, staged_edge, now_ns);
        }
        latest_remaining
    }

    /// Enqueues the staged fragments on `if_id`'s ring, keeping
    /// [`shed_headroom`] of it free for shed notices; a fragment that finds
    /// no room is shed ([`Shedder::shed`]) with what classifying it found
    /// (`staged_info`, in the order of `staged`).
    ///
    /// Then it rings the IF's doorbell if one of them was the first or the
    /// last fragment of its request (`edge`), anything was shed, or the ring
    /// is more than a quarter full: an idle IF dozes rather than polls, and
    /// the fragments between a request's first (which starts its clock,
    /// `latency_us`) and its last can wait in the ring for the last one.
    fn enqueue_staged(
        &mut self,
        if_id: kp_wire::IfId,
        staged: &mut MbufBurst<RX_BURST>,
        staged_info: &[Staged; RX_BURST],
        edge: bool,
        now_ns: u64,
    ) {
        let Some(route) = self.routes.get(if_id) else {
            return; // cannot happen: routes change only between bursts
        };
        let n = staged.len();
        // Waiting shed notices go first; data only once none is left.
        let notices = self.shedder.pending();
        let room = if self.shedder.flush(if_id, &route.ring) {
            route
                .ring
                .free_count()
                .saturating_sub(shed_headroom(route.ring.capacity()))
        } else {
            0
        };
        if n <= room {
            // The common case: everything fits (we are the only producer,
            // so the room cannot shrink under us).
            let enq = route.ring.enqueue_burst(staged) as u64;
            bump(&route.counters.delivered, enq);
            self.counters.record_n(Outcome::Delivered, enq);
            let lost = (n as u64) - enq;
            if lost > 0 {
                bump(&route.counters.ring_full, lost);
                self.counters.record_n(Outcome::RingFull, lost);
                staged.clear();
            }
            let flushed = self.shedder.pending() != notices;
            if wakes_the_if(
                edge,
                flushed,
                lost,
                route.ring.count(),
                route.ring.capacity(),
            ) {
                route.ring_doorbell();
            }
            return;
        }
        let mut delivered = 0;
        for (mbuf, info) in staged.drain().zip(staged_info) {
            let mbuf = if delivered < room {
                match route.ring.enqueue(mbuf) {
                    Ok(()) => {
                        delivered += 1;
                        continue;
                    }
                    Err(m) => m,
                }
            } else {
                mbuf
            };
            let outcome =
                self.shedder
                    .shed(if_id, &route.ring, &self.counters, mbuf, *info, now_ns);
            match outcome {
                Outcome::Shed => bump(&route.counters.shed, 1),
                Outcome::ShedSuppressed => bump(&route.counters.shed_suppressed, 1),
                _ => bump(&route.counters.ring_full, 1),
            }
            self.counters.record(outcome);
        }
        bump(&route.counters.delivered, delivered as u64);
        self.counters.record_n(Outcome::Delivered, delivered as u64);
        // Something was shed: the ring is full and maybe holds a notice.
        route.ring_doorbell();
    }

    /// Answers a fragment for an unregistered IF: the first one of its
    /// request becomes the UNKNOWN_IF error (rewritten in place in the same
    /// mbuf); later ones are dropped.
    fn answer_unknown_if(
        &mut self,
        mut mbuf: Mbuf,
        addr: &FrameAddr,
        header: &FragmentRepr,
        tx: &mut MbufBurst<TX_PENDING>,
        now_ns: u64,
    ) {
        let key = RequestKey {
            src_ip: addr.src_ip,
            src_port: addr.src_port,
            if_id: header.if_id,
            request_id: header.request_id,
        };
        match self.answered.first_answer(&key, now_ns) {
            Answer::AlreadyAnswered => {
                self.counters.record(Outcome::UnknownIfSuppressed);
            }
            Answer::Now { evicted_live } => {
                if evicted_live {
                    bump(&self.counters.answered_evictions, 1);
                }
                self.counters.record(Outcome::UnknownIfAnswered);
                if tx.is_full() {
                    bump(&self.counters.tx_dropped, 1);
                    return;
                }
                if write_error(&mut mbuf, addr, header, Status::UnknownIf) {
                    tx.push(mbuf);
                } else {
                    bump(&self.counters.tx_dropped, 1);
                }
            }
        }
    }

    /// Last attempts to send what is pending, at shutdown; the rest is freed.
    fn flush_tx(&mut self, tx: &mut MbufBurst<TX_PENDING>) {
        for _ in 0..TX_MAX_STALLS {
            self.tx_ring.dequeue_burst(tx);
            if tx.is_empty() {
                return;
            }
            let sent = self.port.tx_burst(Q0, tx);
            bump(&self.counters.tx_sent, sent as u64);
            if sent == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        bump(&self.counters.tx_dropped, tx.len() as u64);
        tx.clear();
    }
}

/// Rewrites `mbuf` (holding the request fragment) into an error answer for
/// it: addressed back to the sender, from the address and port it was sent
/// to. Returns false if the mbuf cannot hold the answer.
pub fn write_error(
    mbuf: &mut Mbuf,
    addr: &FrameAddr,
    header: &FragmentRepr,
    status: Status,
) -> bool {
    let reply = addr.reversed();
    let hdr = reply.header_len();
    let need = hdr + RESPONSE_HEADER_LEN;
    if !mbuf.set_len(need) {
        return false;
    }
    let repr = ResponseRepr::error(
        header.if_id,
        header.request_id,
        header.send_ts_ns,
        status,
        0,
    );
    let buf = mbuf.data_mut();
    if repr.emit(&mut buf[hdr..]).is_err() {
        return false;
    }
    kp_wire::emit_udp_headers(&reply, RESPONSE_HEADER_LEN, buf).is_ok()
}
