/* Threads that wait on an event channel (rdma_get_cm_event) or a completion channel
 * (ibv_get_cq_event) that gets no event and is destroyed: they must never return. One that
 * does prints FAIL and sets `returned`. */
#ifndef SOFTRDMA_CHANNEL_WAITERS_H
#define SOFTRDMA_CHANNEL_WAITERS_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

static volatile int returned;

static void *cm_waiter(void *arg)
{
	struct rdma_cm_event *ev;
	int ret = rdma_get_cm_event(arg, &ev);
	printf("FAIL rdma_get_cm_event returned %d (%s)\n", ret, strerror(errno));
	returned = 1;
	return NULL;
}

static void *cq_waiter(void *arg)
{
	struct ibv_cq *cq;
	void *ctx;
	int ret = ibv_get_cq_event(arg, &cq, &ctx);
	printf("FAIL ibv_get_cq_event returned %d (%s)\n", ret, strerror(errno));
	returned = 1;
	return NULL;
}

#endif
