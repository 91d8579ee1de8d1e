/* Calls on channels that the program has already destroyed, as rping's CM thread makes one
 * at exit when main destroys the channel between two of its rdma_get_cm_event calls (with
 * rdma-core such a call reads freed memory). Here the call must not crash or read freed
 * memory; it waits as a call made a moment earlier would: forever on a blocking descriptor
 * (so rping's thread never reaches its exit(-1)), EBADF on a non-blocking one. Other calls
 * given a destroyed channel fail with EBADF, and channels made afterwards work.
 * Usage: channel_used_after_destroy ADDR  (a local address of the test's own). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#include "channel_waiters.h"

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL " __VA_ARGS__); printf("\n"); return 1; } } while (0)

int main(int argc, char **argv)
{
	struct rdma_event_channel *blocking, *nonblocking, *fresh;
	struct rdma_cm_id *id, *id2;
	struct rdma_cm_event *ev;
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct ibv_comp_channel *cc, *cc_nb, *cc2;
	struct ibv_context *verbs;
	struct ibv_cq *cq;
	pthread_t t1, t2;
	int ret;
	if (argc < 2 || inet_pton(AF_INET, argv[1], &sin.sin_addr) != 1) {
		printf("usage: %s ADDR\n", argv[0]);
		return 2;
	}

	/* The CM's event channel. */
	blocking = rdma_create_event_channel();
	nonblocking = rdma_create_event_channel();
	CHECK(blocking && nonblocking, "rdma_create_event_channel: %s", strerror(errno));
	CHECK(fcntl(nonblocking->fd, F_SETFL, fcntl(nonblocking->fd, F_GETFL) | O_NONBLOCK) == 0,
	      "fcntl: %s", strerror(errno));
	rdma_destroy_event_channel(blocking);
	rdma_destroy_event_channel(nonblocking);
	pthread_create(&t1, NULL, cm_waiter, blocking);
	/* (The waiter reaches its call before a new channel may take the destroyed one's place:
	 * then it would wait on that one.) */
	usleep(200000);
	errno = 0;
	ret = rdma_get_cm_event(nonblocking, &ev);
	CHECK(ret == -1 && errno == EBADF, "rdma_get_cm_event on a destroyed non-blocking channel: %d (%s)",
	      ret, strerror(errno));
	errno = 0;
	ret = rdma_create_id(nonblocking, &id, NULL, RDMA_PS_TCP);
	CHECK(ret == -1 && errno == EBADF, "rdma_create_id on a destroyed channel: %d (%s)", ret,
	      strerror(errno));

	/* Channels made afterwards work (they may take the destroyed ones' place). */
	fresh = rdma_create_event_channel();
	CHECK(fresh, "rdma_create_event_channel after: %s", strerror(errno));
	CHECK(rdma_create_id(fresh, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&sin) == 0, "rdma_bind_addr: %s", strerror(errno));
	CHECK(fcntl(fresh->fd, F_SETFL, fcntl(fresh->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl: %s",
	      strerror(errno));
	errno = 0;
	ret = rdma_get_cm_event(fresh, &ev);
	CHECK(ret == -1 && errno == EAGAIN, "rdma_get_cm_event on a new empty channel: %d (%s)", ret,
	      strerror(errno));
	/* A synchronous id's own channel goes with the id; the next id's works. */
	CHECK(rdma_create_id(NULL, &id2, NULL, RDMA_PS_TCP) == 0, "rdma_create_id sync: %s", strerror(errno));
	CHECK(rdma_destroy_id(id2) == 0, "rdma_destroy_id sync: %s", strerror(errno));
	CHECK(rdma_create_id(NULL, &id2, NULL, RDMA_PS_TCP) == 0, "rdma_create_id sync again: %s",
	      strerror(errno));
	CHECK(id2->channel && id2->channel->fd >= 0, "a synchronous id's channel");

	/* Completion channels. */
	verbs = id->verbs;
	cc = ibv_create_comp_channel(verbs);
	cc_nb = ibv_create_comp_channel(verbs);
	CHECK(cc && cc_nb, "ibv_create_comp_channel: %s", strerror(errno));
	CHECK(fcntl(cc_nb->fd, F_SETFL, fcntl(cc_nb->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl: %s",
	      strerror(errno));
	CHECK(ibv_destroy_comp_channel(cc) == 0, "ibv_destroy_comp_channel: %s", strerror(errno));
	CHECK(ibv_destroy_comp_channel(cc_nb) == 0, "ibv_destroy_comp_channel: %s", strerror(errno));
	ret = ibv_destroy_comp_channel(cc_nb);
	CHECK(ret == EBADF, "a second ibv_destroy_comp_channel: %d", ret);
	pthread_create(&t2, NULL, cq_waiter, cc);
	usleep(200000);
	{
		struct ibv_cq *c2;
		void *ctx;
		errno = 0;
		ret = ibv_get_cq_event(cc_nb, &c2, &ctx);
		CHECK(ret == -1 && errno == EBADF, "ibv_get_cq_event on a destroyed non-blocking channel: %d (%s)",
		      ret, strerror(errno));
	}
	errno = 0;
	cq = ibv_create_cq(verbs, 4, NULL, cc_nb, 0);
	CHECK(!cq && errno == EBADF, "ibv_create_cq on a destroyed channel: %p (%s)", (void *)cq,
	      strerror(errno));
	cc2 = ibv_create_comp_channel(verbs);
	CHECK(cc2, "ibv_create_comp_channel after: %s", strerror(errno));
	cq = ibv_create_cq(verbs, 4, NULL, cc2, 0);
	CHECK(cq, "ibv_create_cq on a new channel: %s", strerror(errno));
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq: %s", strerror(errno));
	/* A channel a CQ uses is not destroyed (EBUSY) and stays as it was. */
	ret = ibv_destroy_comp_channel(cc2);
	CHECK(ret == EBUSY, "ibv_destroy_comp_channel of a channel in use: %d", ret);
	CHECK(fcntl(cc2->fd, F_SETFL, fcntl(cc2->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl: %s",
	      strerror(errno));
	{
		struct ibv_cq *c2;
		void *ctx;
		errno = 0;
		ret = ibv_get_cq_event(cc2, &c2, &ctx);
		CHECK(ret == -1 && errno == EAGAIN, "ibv_get_cq_event on a channel kept: %d (%s)", ret,
		      strerror(errno));
	}
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq: %s", strerror(errno));
	CHECK(ibv_destroy_comp_channel(cc2) == 0, "ibv_destroy_comp_channel: %s", strerror(errno));

	CHECK(rdma_destroy_id(id2) == 0 && rdma_destroy_id(id) == 0, "rdma_destroy_id: %s", strerror(errno));
	rdma_destroy_event_channel(fresh);
	/* The late blocking waiters are still waiting after several of the library's wait
	 * rounds (it looks at its devices every 100 ms). */
	usleep(300000);
	if (returned)
		return 1;
	printf("channel_used_after_destroy: ok\n");
	return 0;
}
