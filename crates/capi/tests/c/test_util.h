/*
 * Helpers shared by the C test programs: CHECK, opening a device by name, and moving an RC QP through INIT, RTR and
 * RTS to a QP of the same device (GID index 0, PSN 0, MTU 1024, one READ/atomic in flight,
 * retry counts 7).
 */
#ifndef SOFTRDMA_TEST_UTIL_H
#define SOFTRDMA_TEST_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

/* Fails the program with the location, a message and errno unless c holds. */
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d)\n", errno); exit(1); } } while (0)

/* Opens the device called `name`; *list is the device list, to free with
 * ibv_free_device_list once done. Fails the program when there is no such device. */
static inline struct ibv_context *open_device_named(const char *name, struct ibv_device ***list)
{
	int num;
	*list = ibv_get_device_list(&num);
	CHECK(*list, "ibv_get_device_list");
	struct ibv_device *dev = NULL;
	for (int i = 0; i < num; i++)
		if (!strcmp(ibv_get_device_name((*list)[i]), name))
			dev = (*list)[i];
	CHECK(dev, "device %s not listed", name);
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx, "ibv_open_device");
	return ctx;
}

/* Connects the RC QP qp to the QP dest at gid, granting the peer `access` (IBV_ACCESS_*). */
static inline void connect_rc_qp(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *gid,
				 unsigned int access)
{
	struct ibv_qp_attr at;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_INIT;
	at.port_num = 1;
	at.qp_access_flags = access;
	CHECK(!ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS), "INIT");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = dest;
	at.rq_psn = 0;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 12;
	at.ah_attr.is_global = 1;
	at.ah_attr.grh.dgid = *gid;
	at.ah_attr.grh.hop_limit = 1;
	at.ah_attr.port_num = 1;
	CHECK(!ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			     IBV_QP_MIN_RNR_TIMER), "RTR");
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.sq_psn = 0;
	at.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), "RTS");
}

#endif
