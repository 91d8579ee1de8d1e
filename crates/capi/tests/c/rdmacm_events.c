/* The events of a connection, both ends in this process (one device): CONNECT_REQUEST with
 * a new id (listener's context, addresses, private data), REJECTED with the rejecter's
 * private data, ESTABLISHED with the acceptor's, DISCONNECTED on both ends; each event's
 * private data stays readable until it is acked.
 * Usage: rdmacm_events ADDR  (a local address of the test's own). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int failures;

#define CHECK(cond)                                                               \
	do {                                                                      \
		if (!(cond)) {                                                    \
			printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #cond);     \
			failures++;                                                   \
		}                                                                 \
	} while (0)

#define OK(call)                                                                          \
	do {                                                                              \
		if ((call) != 0) {                                                        \
			printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #call, strerror(errno)); \
			exit(1);                                                          \
		}                                                                         \
	} while (0)

/* The next event (a 30 s hang guard, not a timing check); exits if none or not `want`. */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	if (poll(&p, 1, 30000) != 1) {
		printf("FAIL no event (wanted %s)\n", rdma_event_str(want));
		exit(1);
	}
	OK(rdma_get_cm_event(ch, &ev));
	printf("%s status %d\n", rdma_event_str(ev->event), ev->status);
	if (ev->event != want) {
		printf("FAIL got %s, wanted %s\n", rdma_event_str(ev->event), rdma_event_str(want));
		exit(1);
	}
	return ev;
}

static int pdata_is(const void *p, int len, const char *s)
{
	return p && len >= (int)strlen(s) && memcmp(p, s, strlen(s)) == 0;
}

static struct rdma_cm_id *connect_to(struct rdma_event_channel *ch, struct sockaddr_in *src,
				     struct sockaddr_in *dst, const char *pdata)
{
	struct rdma_cm_id *id;
	OK(rdma_create_id(ch, &id, (void *)0xc1, RDMA_PS_TCP));
	OK(rdma_resolve_addr(id, (struct sockaddr *)src, (struct sockaddr *)dst, 2000));
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	OK(rdma_resolve_route(id, 2000));
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	OK(rdma_create_qp(id, NULL, &qa));
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	cp.private_data = pdata;
	cp.private_data_len = strlen(pdata);
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	OK(rdma_connect(id, &cp));
	return id;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	setvbuf(stdout, NULL, _IONBF, 0);
	struct sockaddr_in me;
	memset(&me, 0, sizeof me);
	me.sin_family = AF_INET;
	inet_pton(AF_INET, argv[1], &me.sin_addr);

	struct rdma_event_channel *sch = rdma_create_event_channel();
	struct rdma_event_channel *cch = rdma_create_event_channel();
	struct rdma_cm_id *listener, *child, *client;
	OK(rdma_create_id(sch, &listener, (void *)0x5e, RDMA_PS_TCP));
	OK(rdma_bind_addr(listener, (struct sockaddr *)&me));
	OK(rdma_listen(listener, 8));
	struct sockaddr_in dst = me;
	dst.sin_port = rdma_get_src_port(listener);
	struct sockaddr_in src = me;
	src.sin_port = 0;

	/* 1: rejected with private data. */
	client = connect_to(cch, &src, &dst, "hello");
	struct rdma_cm_event *ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	child = ev->id;
	CHECK(child != listener && ev->listen_id == listener);
	CHECK(child->context == (void *)0x5e && child->channel == sch && child->verbs != NULL);
	CHECK(child->ps == RDMA_PS_TCP && child->qp_type == IBV_QPT_RC && child->port_num == 1);
	CHECK(child->qp == NULL);
	CHECK(pdata_is(ev->param.conn.private_data, ev->param.conn.private_data_len, "hello"));
	CHECK(ev->param.conn.responder_resources == 1 && ev->param.conn.initiator_depth == 1);
	CHECK(rdma_get_dst_port(child) == rdma_get_src_port(client));
	CHECK(rdma_get_src_port(child) == dst.sin_port);
	CHECK(((struct sockaddr_in *)rdma_get_peer_addr(child))->sin_addr.s_addr == me.sin_addr.s_addr);
	OK(rdma_reject(child, "no", 2));
	OK(rdma_ack_cm_event(ev));
	ev = expect(cch, RDMA_CM_EVENT_REJECTED);
	CHECK(ev->id == client && ev->status == 28);
	CHECK(pdata_is(ev->param.conn.private_data, ev->param.conn.private_data_len, "no"));
	OK(rdma_ack_cm_event(ev));
	OK(rdma_destroy_id(child));
	rdma_destroy_qp(client);
	OK(rdma_destroy_id(client));

	/* 2: accepted with private data, then disconnected. */
	client = connect_to(cch, &src, &dst, "again");
	ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	child = ev->id;
	CHECK(pdata_is(ev->param.conn.private_data, ev->param.conn.private_data_len, "again"));
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	OK(rdma_create_qp(child, NULL, &qa));
	CHECK(child->qp != NULL && child->qp->state == IBV_QPS_INIT);
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	cp.private_data = "yes";
	cp.private_data_len = 3;
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	OK(rdma_accept(child, &cp));
	OK(rdma_ack_cm_event(ev));
	ev = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev->id == client && ev->status == 0);
	CHECK(pdata_is(ev->param.conn.private_data, ev->param.conn.private_data_len, "yes"));
	CHECK(client->qp->state == IBV_QPS_RTS);
	OK(rdma_ack_cm_event(ev));
	ev = expect(sch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev->id == child && ev->listen_id == NULL);
	CHECK(child->qp->state == IBV_QPS_RTS);
	OK(rdma_ack_cm_event(ev));
	errno = 0;
	CHECK(rdma_accept(child, &cp) == -1 && errno == EINVAL);
	OK(rdma_disconnect(client));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_DISCONNECTED));
	ev = expect(sch, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(ev->id == child);
	OK(rdma_ack_cm_event(ev));
	OK(rdma_disconnect(child));
	CHECK(client->qp->state == IBV_QPS_ERR);

	rdma_destroy_qp(child);
	OK(rdma_destroy_id(child));
	rdma_destroy_qp(client);
	OK(rdma_destroy_id(client));
	OK(rdma_destroy_id(listener));
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
	if (failures) {
		printf("%d failure(s)\n", failures);
		return 1;
	}
	printf("rdmacm_events: all checks passed\n");
	return 0;
}
