/* A program that destroys its event channels while a thread of its own still waits on them,
 * as rping does at exit: with rdma-core that thread stays blocked (in read(2) on the closed
 * descriptor) and the program ends normally when main returns. So must it here: no crash,
 * no error returned to the waiting threads (rping's CM thread calls exit(-1) on one), for
 * the CM's event channel (rdma_get_cm_event) and a completion channel (ibv_get_cq_event).
 * Usage: channel_destroyed_while_waiting ADDR  (a local address of the test's own). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#include "channel_waiters.h"

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct ibv_comp_channel *cc;
	pthread_t t1, t2;
	if (argc < 2 || inet_pton(AF_INET, argv[1], &sin.sin_addr) != 1) {
		printf("usage: %s ADDR\n", argv[0]);
		return 2;
	}
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_bind_addr(id, (struct sockaddr *)&sin)) {
		printf("FAIL setup: %s\n", strerror(errno));
		return 1;
	}
	cc = ibv_create_comp_channel(id->verbs);
	if (!cc) {
		printf("FAIL ibv_create_comp_channel: %s\n", strerror(errno));
		return 1;
	}
	pthread_create(&t1, NULL, cm_waiter, ch);
	pthread_create(&t2, NULL, cq_waiter, cc);
	usleep(100000);
	/* Both threads wait now (or are about to). */
	if (rdma_destroy_id(id) || ibv_destroy_comp_channel(cc)) {
		printf("FAIL destroy: %s\n", strerror(errno));
		return 1;
	}
	rdma_destroy_event_channel(ch);
	/* Several of the library's wait rounds pass (it looks at its devices every 100 ms). */
	usleep(400000);
	if (returned)
		return 1;
	printf("channel_destroyed_while_waiting: ok\n");
	return 0;
}
