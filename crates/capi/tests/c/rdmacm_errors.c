/* Bad input on the connection manager's side: every call fails with -1 and the errno
 * librdmacm (and the kernel's rdma_ucm under it) gives, and nothing crashes.
 * Usage: rdmacm_errors ADDR  (a local address of the test's own; nothing listens on it). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

static int failures;

#define EXPECT_ERR(call, err)                                                         \
	do {                                                                          \
		errno = 0;                                                            \
		int r_ = (call);                                                      \
		if (r_ != -1 || errno != (err)) {                                     \
			printf("FAIL %s:%d %s = %d errno %d (%s), want -1 errno %d\n", \
			       __FILE__, __LINE__, #call, r_, errno, strerror(errno), \
			       (err));                                                \
			failures++;                                                   \
		}                                                                     \
	} while (0)

#define EXPECT_OK(call)                                                                 \
	do {                                                                            \
		errno = 0;                                                              \
		int r_ = (call);                                                        \
		if (r_ != 0) {                                                          \
			printf("FAIL %s:%d %s = %d errno %d (%s)\n", __FILE__, __LINE__, \
			       #call, r_, errno, strerror(errno));                      \
			failures++;                                                     \
		}                                                                       \
	} while (0)

#define CHECK(cond)                                                               \
	do {                                                                      \
		if (!(cond)) {                                                    \
			printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #cond);     \
			failures++;                                                   \
		}                                                                 \
	} while (0)

static struct sockaddr_in sin_of(const char *ip, int port)
{
	struct sockaddr_in s;
	memset(&s, 0, sizeof s);
	s.sin_family = AF_INET;
	s.sin_port = htons(port);
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

/* The next event of the channel, its type and status copied out, acked (-1 when none comes
 * within 30 s: a hang guard, not a timing check). */
static int next_event(struct rdma_event_channel *ch, int *status)
{
	struct rdma_cm_event *ev;
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	if (poll(&p, 1, 30000) != 1) {
		printf("FAIL no event\n");
		failures++;
		return -1;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		printf("FAIL rdma_get_cm_event: %s\n", strerror(errno));
		failures++;
		return -1;
	}
	int type = ev->event;
	*status = ev->status;
	printf("event %s status %d\n", rdma_event_str(ev->event), ev->status);
	EXPECT_OK(rdma_ack_cm_event(ev));
	return type;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s ADDR\n", argv[0]);
		return 2;
	}
	const char *ip = argv[1];
	setvbuf(stdout, NULL, _IONBF, 0);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL && ch->fd >= 0);
	struct rdma_cm_id *id = NULL, *id2 = NULL;
	struct rdma_cm_event *ev = NULL;

	/* Ids. */
	EXPECT_ERR(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP), EINVAL);
	EXPECT_ERR(rdma_create_id(ch, &id, NULL, (enum rdma_port_space)0x999), EINVAL);
	EXPECT_ERR(rdma_destroy_id(NULL), EINVAL);
	EXPECT_ERR(rdma_bind_addr(NULL, NULL), EINVAL);
	EXPECT_ERR(rdma_listen(NULL, 1), EINVAL);
	EXPECT_ERR(rdma_connect(NULL, NULL), EINVAL);
	EXPECT_ERR(rdma_accept(NULL, NULL), EINVAL);
	EXPECT_ERR(rdma_disconnect(NULL), EINVAL);
	EXPECT_ERR(rdma_migrate_id(NULL, ch), EINVAL);
	EXPECT_ERR(rdma_resolve_route(NULL, 100), EINVAL);
	EXPECT_OK(rdma_create_id(ch, &id, (void *)0x1234, RDMA_PS_TCP));
	CHECK(id->context == (void *)0x1234 && id->channel == ch && id->ps == RDMA_PS_TCP);
	CHECK(id->qp_type == IBV_QPT_RC && id->verbs == NULL && id->qp == NULL);
	CHECK(rdma_get_local_addr(id)->sa_family == 0);
	CHECK(rdma_get_src_port(id) == 0 && rdma_get_dst_port(id) == 0);

	/* Events. */
	EXPECT_ERR(rdma_get_cm_event(NULL, &ev), EINVAL);
	EXPECT_ERR(rdma_get_cm_event(ch, NULL), EINVAL);
	EXPECT_ERR(rdma_ack_cm_event(NULL), EINVAL);
	int fl = fcntl(ch->fd, F_GETFL);
	EXPECT_OK(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == -1);
	EXPECT_ERR(rdma_get_cm_event(ch, &ev), EAGAIN);
	EXPECT_OK(fcntl(ch->fd, F_SETFL, fl) == -1);
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0);
	CHECK(strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT") == 0);

	/* Calls in the wrong state. */
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	cp.qp_num = 1234;
	EXPECT_ERR(rdma_resolve_route(id, 100), EINVAL);
	EXPECT_ERR(rdma_connect(id, &cp), EINVAL);
	EXPECT_ERR(rdma_accept(id, &cp), EINVAL);
	EXPECT_ERR(rdma_reject(id, NULL, 0), EINVAL);
	EXPECT_ERR(rdma_disconnect(id), EINVAL);
	EXPECT_ERR(rdma_establish(id), EINVAL);
	struct ibv_qp_init_attr qpa;
	memset(&qpa, 0, sizeof qpa);
	qpa.qp_type = IBV_QPT_RC;
	qpa.cap.max_send_wr = qpa.cap.max_recv_wr = 1;
	qpa.cap.max_send_sge = qpa.cap.max_recv_sge = 1;
	EXPECT_ERR(rdma_create_qp(id, NULL, &qpa), EINVAL);
	EXPECT_ERR(rdma_create_qp(id, NULL, NULL), EINVAL);
	struct ibv_qp_attr qa;
	int mask;
	memset(&qa, 0, sizeof qa);
	qa.qp_state = IBV_QPS_RTR;
	EXPECT_ERR(rdma_init_qp_attr(id, &qa, &mask), EINVAL);
	EXPECT_ERR(rdma_init_qp_attr(id, NULL, &mask), EINVAL);
	EXPECT_ERR(rdma_get_request(id, &id2), EINVAL);
	EXPECT_ERR(rdma_notify(id, IBV_EVENT_COMM_EST), EINVAL);
	EXPECT_OK(rdma_notify(id, IBV_EVENT_QP_FATAL));
	EXPECT_ERR(rdma_reject_ece(id, NULL, 0), EINVAL);
	struct ibv_ece ece;
	memset(&ece, 0, sizeof ece);
	EXPECT_ERR(rdma_get_remote_ece(id, &ece), EOPNOTSUPP);
	EXPECT_ERR(rdma_set_local_ece(id, &ece), EOPNOTSUPP);

	/* Options. */
	uint8_t tos = 32;
	int one = 1;
	EXPECT_OK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos));
	EXPECT_ERR(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4), EINVAL);
	EXPECT_ERR(rdma_set_option(id, RDMA_OPTION_ID, 99, &one, sizeof one), ENOSYS);
	EXPECT_ERR(rdma_set_option(id, 99, 0, &one, sizeof one), ENOSYS);
	EXPECT_OK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one));
	EXPECT_ERR(rdma_set_local_ece(id, NULL), EINVAL);

	/* Addresses. */
	struct sockaddr_un_like {
		sa_family_t f;
		char path[30];
	} un = { AF_UNIX, "x" };
	EXPECT_ERR(rdma_bind_addr(id, (struct sockaddr *)&un), EINVAL);
	struct sockaddr_in other = sin_of("192.0.2.1", 0);
	EXPECT_ERR(rdma_bind_addr(id, (struct sockaddr *)&other), EADDRNOTAVAIL);
	struct sockaddr_in me = sin_of(ip, 0);
	EXPECT_OK(rdma_bind_addr(id, (struct sockaddr *)&me));
	CHECK(id->verbs != NULL && id->port_num == 1 && id->pd != NULL);
	CHECK(((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr.s_addr == me.sin_addr.s_addr);
	uint16_t port = ntohs(rdma_get_src_port(id));
	CHECK(port != 0);
	CHECK(((struct sockaddr_in *)rdma_get_local_addr(id))->sin_port == htons(port));
	EXPECT_ERR(rdma_bind_addr(id, (struct sockaddr *)&me), EINVAL);
	EXPECT_ERR(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one), EINVAL);

	/* A QP through the CM: CQs and channels made for it (cq_context == id), INIT. */
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof sa);
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	EXPECT_OK(rdma_create_srq(id, NULL, &sa));
	CHECK(id->srq != NULL);
	EXPECT_ERR(rdma_create_srq(id, NULL, &sa), EINVAL);
	struct ibv_srq_init_attr_ex sx;
	memset(&sx, 0, sizeof sx);
	sx.attr = sa.attr;
	sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
	sx.srq_type = IBV_SRQT_XRC;
	EXPECT_ERR(rdma_create_srq_ex(id, &sx), EOPNOTSUPP);
	EXPECT_OK(rdma_create_qp(id, NULL, &qpa));
	CHECK(id->qp != NULL && id->qp->state == IBV_QPS_INIT && id->qp->qp_type == IBV_QPT_RC);
	CHECK(id->qp->pd == id->pd && id->qp->srq == id->srq && id->qp->context == id->verbs);
	CHECK(id->send_cq != NULL && id->recv_cq != NULL && id->send_cq != id->recv_cq);
	CHECK(id->send_cq->cq_context == id && id->recv_cq->cq_context == id);
	CHECK(id->send_cq_channel != NULL && id->recv_cq_channel != NULL);
	CHECK(id->send_cq->channel == id->send_cq_channel && id->send_cq_channel->fd >= 0);
	CHECK(qpa.cap.max_send_wr >= 1);
	EXPECT_ERR(rdma_create_qp(id, NULL, &qpa), EINVAL);
	rdma_destroy_qp(id);
	CHECK(id->qp == NULL && id->send_cq == NULL && id->recv_cq == NULL);
	CHECK(id->send_cq_channel == NULL && id->recv_cq_channel == NULL);
	rdma_destroy_srq(id);
	CHECK(id->srq == NULL);
	struct ibv_qp_init_attr_ex qx;
	memset(&qx, 0, sizeof qx);
	qx.qp_type = IBV_QPT_RC;
	qx.cap = qpa.cap;
	qx.comp_mask = IBV_QP_INIT_ATTR_PD;
	qx.pd = id->pd;
	EXPECT_OK(rdma_create_qp_ex(id, &qx));
	CHECK(id->qp != NULL && id->qp->pd == qx.pd);
	CHECK(ibv_qp_to_qp_ex(id->qp) == NULL);
	rdma_destroy_qp(id);
	qx.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qx.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	EXPECT_OK(rdma_create_qp_ex(id, &qx));
	CHECK(id->qp != NULL && ibv_qp_to_qp_ex(id->qp) == (struct ibv_qp_ex *)id->qp);
	rdma_destroy_qp(id);
	qx.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	qx.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	EXPECT_ERR(rdma_create_qp_ex(id, &qx), EOPNOTSUPP);
	CHECK(id->qp == NULL && id->send_cq == NULL);
	qpa.qp_type = IBV_QPT_UD;
	EXPECT_ERR(rdma_create_qp(id, NULL, &qpa), EINVAL); /* UD in the TCP port space */
	qpa.qp_type = IBV_QPT_RC;
	EXPECT_OK(rdma_listen(id, 4));
	EXPECT_OK(rdma_create_id(ch, &id2, NULL, RDMA_PS_TCP));
	struct sockaddr_in same = sin_of(ip, port);
	EXPECT_ERR(rdma_bind_addr(id2, (struct sockaddr *)&same), EADDRINUSE);
	EXPECT_ERR(rdma_accept(id, NULL), EINVAL);
	EXPECT_OK(rdma_destroy_id(id2));
	EXPECT_OK(rdma_destroy_id(id));

	/* rping's teardown with a PD of the application's: the PD cannot go while the id's QP
	 * uses it (EBUSY), and can once rdma_destroy_qp took the QP (and its CQs) away, before
	 * the id is destroyed. */
	struct rdma_cm_id *id3 = NULL;
	EXPECT_OK(rdma_create_id(ch, &id3, NULL, RDMA_PS_TCP));
	struct sockaddr_in any3 = sin_of(ip, 0);
	EXPECT_OK(rdma_bind_addr(id3, (struct sockaddr *)&any3));
	struct ibv_pd *apd = ibv_alloc_pd(id3->verbs);
	CHECK(apd != NULL);
	EXPECT_OK(rdma_create_qp(id3, apd, &qpa));
	CHECK(id3->qp != NULL && id3->qp->pd == apd && id3->pd == apd);
	CHECK(ibv_dealloc_pd(apd) == EBUSY);
	rdma_destroy_qp(id3);
	CHECK(ibv_dealloc_pd(apd) == 0);
	EXPECT_OK(rdma_destroy_id(id3));

	/* perftest's teardown of its rdma_cm control connection: ibv_destroy_qp on the id's QP
	 * (no rdma_destroy_qp) frees the QP at once, as the kernel does, so its CQ and PD can go
	 * before the id; id->qp no longer points at it. Also with the id destroyed first. */
	for (int id_first = 0; id_first < 2; id_first++) {
		EXPECT_OK(rdma_create_id(ch, &id3, NULL, RDMA_PS_TCP));
		EXPECT_OK(rdma_bind_addr(id3, (struct sockaddr *)&any3));
		apd = ibv_alloc_pd(id3->verbs);
		struct ibv_cq *acq = ibv_create_cq(id3->verbs, 8, NULL, NULL, 0);
		CHECK(apd != NULL && acq != NULL);
		struct ibv_qp_init_attr aqa = qpa;
		aqa.send_cq = acq;
		aqa.recv_cq = acq;
		EXPECT_OK(rdma_create_qp(id3, apd, &aqa));
		struct ibv_qp *aqp = id3->qp;
		CHECK(aqp != NULL && aqp->pd == apd);
		if (id_first)
			EXPECT_OK(rdma_destroy_id(id3));
		CHECK(ibv_destroy_qp(aqp) == 0);
		if (!id_first)
			CHECK(id3->qp == NULL);
		CHECK(ibv_destroy_cq(acq) == 0);
		CHECK(ibv_dealloc_pd(apd) == 0);
		if (!id_first)
			EXPECT_OK(rdma_destroy_id(id3));
	}

	/* Connect to a port nobody listens on: REJECTED with reason 8. */
	EXPECT_OK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP));
	EXPECT_ERR(rdma_resolve_addr(id, NULL, NULL, 100), EINVAL);
	struct sockaddr_in dst = sin_of(ip, port);
	me = sin_of(ip, 0);
	EXPECT_OK(rdma_resolve_addr(id, (struct sockaddr *)&me, (struct sockaddr *)&dst, 2000));
	int st;
	CHECK(next_event(ch, &st) == RDMA_CM_EVENT_ADDR_RESOLVED && st == 0);
	CHECK(id->verbs != NULL);
	CHECK(((struct sockaddr_in *)rdma_get_peer_addr(id))->sin_port == htons(port));
	EXPECT_ERR(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), EINVAL);
	EXPECT_ERR(rdma_connect(id, &cp), EINVAL); /* the route is not resolved */
	EXPECT_OK(rdma_resolve_route(id, 2000));
	CHECK(next_event(ch, &st) == RDMA_CM_EVENT_ROUTE_RESOLVED && st == 0);
	CHECK(id->route.num_paths == 1 && id->route.path_rec != NULL);
	EXPECT_ERR(rdma_connect(id, NULL), EINVAL); /* no QP and no qp_num */
	memset(&qa, 0, sizeof qa);
	qa.qp_state = IBV_QPS_INIT;
	EXPECT_OK(rdma_init_qp_attr(id, &qa, &mask));
	CHECK((mask & IBV_QP_STATE) && (mask & IBV_QP_PORT) && qa.port_num == 1);
	EXPECT_OK(rdma_connect(id, &cp));
	CHECK(next_event(ch, &st) == RDMA_CM_EVENT_REJECTED && st == 8);
	EXPECT_OK(rdma_destroy_id(id));

	/* Synchronous ids: a private channel; errors come back from the call. */
	EXPECT_OK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP));
	CHECK(id->channel != NULL && id->channel->fd >= 0 && id->channel != ch);
	EXPECT_OK(rdma_resolve_addr(id, (struct sockaddr *)&me, (struct sockaddr *)&dst, 2000));
	CHECK(id->event != NULL && id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
	EXPECT_OK(rdma_resolve_route(id, 2000));
	EXPECT_ERR(rdma_connect(id, &cp), ECONNREFUSED);
	CHECK(id->event != NULL && id->event->event == RDMA_CM_EVENT_REJECTED);
	EXPECT_ERR(rdma_migrate_id(id, NULL), EINVAL);
	EXPECT_OK(rdma_destroy_id(id));

	/* Multicast. */
	EXPECT_OK(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP));
	CHECK(id->qp_type == IBV_QPT_UD);
	struct sockaddr_in mc = sin_of("239.1.2.3", 0);
	struct rdma_cm_join_mc_attr_ex mca;
	memset(&mca, 0, sizeof mca);
	mca.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
	mca.addr = (struct sockaddr *)&mc;
	EXPECT_ERR(rdma_join_multicast_ex(id, &mca, NULL), ENOTSUP);
	mca.comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	EXPECT_ERR(rdma_join_multicast_ex(id, &mca, NULL), EINVAL);
	EXPECT_ERR(rdma_join_multicast(id, NULL, NULL), EINVAL);
	me = sin_of(ip, 0);
	EXPECT_OK(rdma_bind_addr(id, (struct sockaddr *)&me));
	EXPECT_ERR(rdma_leave_multicast(id, (struct sockaddr *)&mc), EADDRNOTAVAIL);
	qpa.qp_type = IBV_QPT_UD;
	EXPECT_OK(rdma_create_qp(id, NULL, &qpa));
	CHECK(id->qp != NULL && id->qp->state == IBV_QPS_RTS);
	EXPECT_OK(rdma_join_multicast(id, (struct sockaddr *)&mc, (void *)0x77));
	EXPECT_OK(rdma_get_cm_event(ch, &ev));
	CHECK(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->status == 0 && ev->id == id);
	CHECK(ev->param.ud.private_data == (void *)0x77 && ev->param.ud.qkey == RDMA_UDP_QKEY);
	CHECK(ev->param.ud.qp_num == 0xffffff && ev->param.ud.ah_attr.is_global);
	EXPECT_OK(rdma_ack_cm_event(ev));
	EXPECT_ERR(rdma_join_multicast(id, (struct sockaddr *)&mc, NULL), EADDRINUSE);
	EXPECT_OK(rdma_leave_multicast(id, (struct sockaddr *)&mc));
	rdma_destroy_qp(id);
	EXPECT_ERR(rdma_disconnect(id), EINVAL);
	EXPECT_OK(rdma_destroy_id(id));

	/* Address lookup. */
	struct rdma_addrinfo hints, *res = NULL;
	EXPECT_ERR(rdma_getaddrinfo(NULL, NULL, NULL, &res), EINVAL);
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_NUMERICHOST;
	CHECK(rdma_getaddrinfo("no.such.host.invalid", "7471", &hints, &res) == EAI_NONAME);
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	EXPECT_OK(rdma_getaddrinfo(ip, "7471", &hints, &res));
	CHECK(res != NULL && res->ai_src_addr != NULL && res->ai_dst_len == 0);
	CHECK(res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC);
	CHECK(((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7471));
	/* Each field is malloc'ed on its own: a program may free and replace one (libfabric
	 * does), and rdma_freeaddrinfo frees what the fields hold then. */
	struct sockaddr_in *own = malloc(sizeof *own);
	CHECK(own != NULL);
	memcpy(own, res->ai_src_addr, sizeof *own);
	free(res->ai_src_addr);
	res->ai_src_addr = (struct sockaddr *)own;
	rdma_freeaddrinfo(res);

	/* Devices. */
	int n = -1;
	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs != NULL && n >= 1 && devs[n] == NULL && devs[0] != NULL);
	rdma_free_devices(devs);

	/* rsocket is not implemented. */
	EXPECT_ERR(rsocket(AF_INET, SOCK_STREAM, 0), ENOSYS);

	rdma_destroy_event_channel(ch);
	if (failures) {
		printf("%d failure(s)\n", failures);
		return 1;
	}
	printf("rdmacm_errors: all checks passed\n");
	return 0;
}
