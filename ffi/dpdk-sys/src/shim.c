/*
 * One-to-one wrappers for DPDK's static-inline functions, so that Rust can
 * call them. Each is documented in bindings.h; none adds behaviour.
 */

#include "bindings.h"

uint16_t kp_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
                             struct rte_mbuf **rx_pkts, uint16_t nb_pkts) {
    return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t kp_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
                             struct rte_mbuf **tx_pkts, uint16_t nb_pkts) {
    return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

int kp_rte_eth_rx_queue_count(uint16_t port_id, uint16_t queue_id) {
    return rte_eth_rx_queue_count(port_id, queue_id);
}

struct rte_mbuf *kp_rte_pktmbuf_alloc(struct rte_mempool *mp) {
    return rte_pktmbuf_alloc(mp);
}

int kp_rte_pktmbuf_alloc_bulk(struct rte_mempool *pool,
                              struct rte_mbuf **mbufs, unsigned count) {
    return rte_pktmbuf_alloc_bulk(pool, mbufs, count);
}

void kp_rte_pktmbuf_free(struct rte_mbuf *m) {
    rte_pktmbuf_free(m);
}

void *kp_rte_pktmbuf_mtod(struct rte_mbuf *m) {
    return rte_pktmbuf_mtod(m, void *);
}

uint16_t kp_rte_pktmbuf_data_len(const struct rte_mbuf *m) {
    return rte_pktmbuf_data_len(m);
}

uint32_t kp_rte_pktmbuf_pkt_len(const struct rte_mbuf *m) {
    return rte_pktmbuf_pkt_len(m);
}

char *kp_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len) {
    return rte_pktmbuf_append(m, len);
}

char *kp_rte_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len) {
    return rte_pktmbuf_prepend(m, len);
}

char *kp_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len) {
    return rte_pktmbuf_adj(m, len);
}

int kp_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len) {
    return rte_pktmbuf_trim(m, len);
}

void kp_rte_pktmbuf_reset(struct rte_mbuf *m) {
    rte_pktmbuf_reset(m);
}

uint16_t kp_rte_pktmbuf_headroom(const struct rte_mbuf *m) {
    return rte_pktmbuf_headroom(m);
}

uint16_t kp_rte_pktmbuf_tailroom(const struct rte_mbuf *m) {
    return rte_pktmbuf_tailroom(m);
}

uint16_t kp_rte_mbuf_refcnt_read(const struct rte_mbuf *m) {
    return rte_mbuf_refcnt_read(m);
}

unsigned int kp_rte_ring_enqueue_burst(struct rte_ring *r,
                                       void *const *obj_table, unsigned int n,
                                       unsigned int *free_space) {
    return rte_ring_enqueue_burst(r, obj_table, n, free_space);
}

unsigned int kp_rte_ring_dequeue_burst(struct rte_ring *r, void **obj_table,
                                       unsigned int n, unsigned int *available) {
    return rte_ring_dequeue_burst(r, obj_table, n, available);
}

unsigned int kp_rte_ring_count(const struct rte_ring *r) {
    return rte_ring_count(r);
}

unsigned int kp_rte_ring_free_count(const struct rte_ring *r) {
    return rte_ring_free_count(r);
}

unsigned int kp_rte_ring_get_capacity(const struct rte_ring *r) {
    return rte_ring_get_capacity(r);
}

int kp_rte_errno(void) {
    return rte_errno;
}

unsigned kp_rte_lcore_id(void) {
    return rte_lcore_id();
}

uint64_t kp_rte_get_tsc_cycles(void) {
    return rte_get_tsc_cycles();
}

void kp_rte_pause(void) {
    rte_pause();
}
