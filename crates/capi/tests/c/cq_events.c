/*
 * ibv_destroy_cq waits, as rdma-core's does, until the completion events taken about the CQ
 * are acknowledged: two RC QPs on the loopback device named by argv[1] exchange a SEND, the
 * receiver's CQ (armed, on a completion channel) raises an event that main takes, and a
 * second thread acknowledges it only after main has started ibv_destroy_cq. The destroy
 * returns 0 after the acknowledgement. It fails with EBUSY at once while a QP still uses
 * the CQ, events or not. Prints "cq_events: ok" on success.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "test_util.h"

static struct ibv_cq *rcq;
static atomic_int started, acked;

static void *acker(void *arg)
{
	(void)arg;
	/* Wait until main is (about to be) inside ibv_destroy_cq, then give it a moment. */
	while (!atomic_load(&started))
		usleep(1000);
	usleep(50000);
	atomic_store(&acked, 1);
	ibv_ack_cq_events(rcq, 1);
	return NULL;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2, "usage: cq_events DEVICE");
	struct ibv_device **list;
	struct ibv_context *ctx = open_device_named(argv[1], &list);
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	CHECK(pd && ch && scq && rcq, "objects");
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	struct ibv_qp_init_attr ia = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	CHECK(a && b, "ibv_create_qp");
	connect_rc_qp(a, b->qp_num, &gid, 0);
	connect_rc_qp(b, a->qp_num, &gid, 0);

	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 32, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(b, &rwr, &rbad), "ibv_post_recv");
	CHECK(!ibv_req_notify_cq(rcq, 0), "ibv_req_notify_cq");
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK(!ibv_post_send(a, &swr, &sbad), "ibv_post_send");
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(!ibv_get_cq_event(ch, &ecq, &ectx) && ecq == rcq, "ibv_get_cq_event");
	struct ibv_wc wc;
	int got = 0;
	while (got == 0)
		got = ibv_poll_cq(rcq, 1, &wc);
	CHECK(got == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7, "receive");

	/* A QP still uses the CQ: EBUSY at once, without waiting for the event's ack. */
	CHECK(ibv_destroy_cq(rcq) == EBUSY, "destroy while a QP uses it");
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "ibv_destroy_qp");

	/* Now the destroy waits for the acknowledgement made by the other thread. */
	pthread_t t;
	CHECK(!pthread_create(&t, NULL, acker, NULL), "pthread_create");
	atomic_store(&started, 1);
	CHECK(ibv_destroy_cq(rcq) == 0, "ibv_destroy_cq");
	CHECK(atomic_load(&acked) == 1, "ibv_destroy_cq returned before the event was acknowledged");
	pthread_join(t, NULL);

	CHECK(!ibv_destroy_cq(scq) && !ibv_dereg_mr(mr), "teardown");
	CHECK(!ibv_destroy_comp_channel(ch) && !ibv_dealloc_pd(pd), "teardown");
	CHECK(!ibv_close_device(ctx), "ibv_close_device");
	ibv_free_device_list(list);
	printf("cq_events: ok\n");
	return 0;
}
