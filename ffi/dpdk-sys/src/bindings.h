/*
 * Input to bindgen for the `dpdk-sys` crate.
 *
 * The DPDK headers we bind, plus the `kp_` shim: one-to-one wrappers for
 * DPDK functions that are `static inline` in the headers (and therefore have
 * no symbol in the shared libraries for Rust to link against). Each wrapper
 * does nothing but call the function of the same name after the `kp_`
 * prefix; its behaviour, preconditions and return value are DPDK's. The
 * definitions are in `shim.c`.
 */

#ifndef KP_DPDK_BINDINGS_H
#define KP_DPDK_BINDINGS_H

#include <rte_config.h>
#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_memzone.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_ring.h>

/* ---- ethdev ------------------------------------------------------------ */

/**
 * rte_eth_rx_burst: receives up to `nb_pkts` packets from an RX queue of a
 * started port into `rx_pkts`; returns how many were received. The caller
 * owns the returned mbufs.
 */
uint16_t kp_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
                             struct rte_mbuf **rx_pkts, uint16_t nb_pkts);

/**
 * rte_eth_tx_burst: hands up to `nb_pkts` packets from the front of
 * `tx_pkts` to a TX queue of a started port; returns how many were taken.
 * The driver owns (and eventually frees) the taken ones; the caller still
 * owns `tx_pkts[ret..nb_pkts]`.
 */
uint16_t kp_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
                             struct rte_mbuf **tx_pkts, uint16_t nb_pkts);

/**
 * rte_eth_rx_queue_count: number of used descriptors of an RX queue, or a
 * negative errno (-ENOTSUP if the driver cannot tell, -EINVAL/-ENODEV).
 */
int kp_rte_eth_rx_queue_count(uint16_t port_id, uint16_t queue_id);

/* ---- mbuf -------------------------------------------------------------- */

/** rte_pktmbuf_alloc: one reset mbuf from `mp`, or NULL if it is empty. */
struct rte_mbuf *kp_rte_pktmbuf_alloc(struct rte_mempool *mp);

/**
 * rte_pktmbuf_alloc_bulk: `count` reset mbufs from `pool` into `mbufs`, all
 * or none; returns 0 on success, a negative errno (-ENOENT) otherwise.
 */
int kp_rte_pktmbuf_alloc_bulk(struct rte_mempool *pool,
                              struct rte_mbuf **mbufs, unsigned count);

/**
 * rte_pktmbuf_free: frees a packet mbuf (every segment) back to its pool;
 * NULL is allowed and does nothing.
 */
void kp_rte_pktmbuf_free(struct rte_mbuf *m);

/* rte_pktmbuf_free_bulk is an exported function in 22.11: no wrapper. */

/** rte_pktmbuf_mtod(m, void *): pointer to the first byte of packet data. */
void *kp_rte_pktmbuf_mtod(struct rte_mbuf *m);

/** rte_pktmbuf_data_len: bytes of data in the first segment. */
uint16_t kp_rte_pktmbuf_data_len(const struct rte_mbuf *m);

/** rte_pktmbuf_pkt_len: bytes of data in all segments. */
uint32_t kp_rte_pktmbuf_pkt_len(const struct rte_mbuf *m);

/**
 * rte_pktmbuf_append: grows the packet by `len` bytes at its end (last
 * segment's tailroom); returns a pointer to the new bytes (uninitialised)
 * or NULL if there is not enough tailroom (then nothing changed).
 */
char *kp_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len);

/**
 * rte_pktmbuf_prepend: grows the packet by `len` bytes at its start (first
 * segment's headroom); returns a pointer to the new start or NULL if there
 * is not enough headroom (then nothing changed).
 */
char *kp_rte_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);

/**
 * rte_pktmbuf_adj: removes `len` bytes from the start of the packet; returns
 * the new start or NULL if `len` exceeds the first segment's data length.
 */
char *kp_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);

/**
 * rte_pktmbuf_trim: removes `len` bytes from the end of the packet; returns
 * 0, or -1 if `len` exceeds the last segment's data length.
 */
int kp_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);

/** rte_pktmbuf_reset: resets a single-segment mbuf's fields to defaults. */
void kp_rte_pktmbuf_reset(struct rte_mbuf *m);

/** rte_pktmbuf_headroom: bytes free before the data of the first segment. */
uint16_t kp_rte_pktmbuf_headroom(const struct rte_mbuf *m);

/** rte_pktmbuf_tailroom: bytes free after the data of the last segment. */
uint16_t kp_rte_pktmbuf_tailroom(const struct rte_mbuf *m);

/** rte_mbuf_refcnt_read: the mbuf's reference count. */
uint16_t kp_rte_mbuf_refcnt_read(const struct rte_mbuf *m);

/* ---- ring -------------------------------------------------------------- */

/**
 * rte_ring_enqueue_burst: enqueues up to `n` pointers from the front of
 * `obj_table`, with the producer mode (SP/MP/RTS/HTS) the ring was created
 * with; returns how many were enqueued; if `free_space` is not NULL it gets
 * the free space left.
 */
unsigned int kp_rte_ring_enqueue_burst(struct rte_ring *r,
                                       void *const *obj_table, unsigned int n,
                                       unsigned int *free_space);

/**
 * rte_ring_dequeue_burst: dequeues up to `n` pointers into `obj_table`, with
 * the consumer mode the ring was created with; returns how many; if
 * `available` is not NULL it gets the number of entries left.
 */
unsigned int kp_rte_ring_dequeue_burst(struct rte_ring *r, void **obj_table,
                                       unsigned int n, unsigned int *available);

/** rte_ring_count: entries in the ring. */
unsigned int kp_rte_ring_count(const struct rte_ring *r);

/** rte_ring_free_count: free entries in the ring. */
unsigned int kp_rte_ring_free_count(const struct rte_ring *r);

/** rte_ring_get_capacity: how many entries the ring can hold. */
unsigned int kp_rte_ring_get_capacity(const struct rte_ring *r);

/* ---- eal --------------------------------------------------------------- */

/** rte_errno: the calling thread's last DPDK error number. */
int kp_rte_errno(void);

/**
 * rte_lcore_id: the calling thread's lcore id; LCORE_ID_ANY (UINT32_MAX)
 * for a thread that is not an EAL thread.
 */
unsigned kp_rte_lcore_id(void);

/** rte_get_tsc_cycles: the CPU's time-stamp counter. */
uint64_t kp_rte_get_tsc_cycles(void);

/** rte_pause: the CPU's spin-wait hint (PAUSE on x86). */
void kp_rte_pause(void);

#endif /* KP_DPDK_BINDINGS_H */
