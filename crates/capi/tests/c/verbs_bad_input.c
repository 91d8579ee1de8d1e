/* Bad input on the verbs side of the drop-in libibverbs (and, on a loopback RC pair, each
 * opcode through the ops table): every bad call below must fail
 * (or succeed) with the return value and errno rdma-core gives, never crash.
 * Usage: verbs_bad_input DEVICE_NAME OTHER_DEVICE_NAME
 * Prints "ok N checks" and exits 0, or names the first failed check and exits 1. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

static int checks;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		checks++;                                                            \
		if (!(cond)) {                                                       \
			fprintf(stderr, "line %d: check failed: %s (errno %d %s)\n", \
				__LINE__, #cond, errno, strerror(errno));            \
			exit(1);                                                     \
		}                                                                    \
	} while (0)

/* A NULL pointer with errno `e`. */
#define FAILS_PTR(expr, e)                       \
	do {                                     \
		errno = 0;                       \
		void *p_ = (void *)(expr);       \
		CHECK(p_ == NULL && errno == (e)); \
	} while (0)

static struct ibv_context *open_named(const char *name)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	CHECK(list != NULL && n > 0);
	CHECK(list[n] == NULL);
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	CHECK(ctx != NULL);
	return ctx;
}

/* Moves an RC QP to RTS, connected to `remote` (same device: loopback). */
static int to_rts(struct ibv_qp *qp, uint32_t remote, union ibv_gid *gid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		return 3;
	return 0;
}

/* Polls `cq` until `n` completions are in `wc` (a spin count guards against a hang). */
static void wait_wcs(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int got = 0;
	long spins = 0;
	while (got < n && spins++ < 50000000) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		CHECK(k >= 0);
		got += k;
	}
	CHECK(got == n);
	for (int i = 0; i < n; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS);
}

/* The completion of `wc[0..n)` with opcode `op`. */
static struct ibv_wc *find_wc(struct ibv_wc *wc, int n, enum ibv_wc_opcode op)
{
	for (int i = 0; i < n; i++)
		if (wc[i].opcode == op)
			return &wc[i];
	CHECK(0);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE OTHER_DEVICE\n", argv[0]);
		return 2;
	}
	struct ibv_context *ctx = open_named(argv[1]);
	struct ibv_context *other = open_named(argv[2]);

	/* Device and context. */
	FAILS_PTR(ibv_open_device(NULL), EINVAL);
	CHECK(ibv_get_device_name(NULL) == NULL);
	CHECK(ibv_close_device(NULL) == -1 && errno == EINVAL);
	CHECK(ctx->async_fd >= 0 && ctx->cmd_fd >= 0 && ctx->num_comp_vectors >= 1);
	CHECK(fcntl(ctx->async_fd, F_GETFD) >= 0 && fcntl(ctx->cmd_fd, F_GETFD) >= 0);

	/* Queries. */
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	uint16_t pkey;
	CHECK(ibv_query_device(ctx, &da) == 0 && da.phys_port_cnt == 1);
	CHECK(ibv_query_device(ctx, NULL) == EINVAL);
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE);
	CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len >= 1);
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL);
	CHECK(ibv_query_port(ctx, 0, &pa) == EINVAL);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	CHECK(ibv_query_gid(ctx, 1, pa.gid_tbl_len, &gid) == -1);
	CHECK(ibv_query_gid(ctx, 2, 0, &gid) == -1);
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == 0xffff);
	CHECK(ibv_query_pkey(ctx, 1, 1, &pkey) == -1);
	CHECK(ibv_get_pkey_index(ctx, 1, 0xffff) == 0);
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0x1234)) == -1);

	/* The size-aware query_port slot never writes past the caller's size, and the
	 * exported IBVERBS_1.1 ibv_query_port writes only the 48-byte compat layout. */
	{
		struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
		unsigned char buf[128];
		CHECK(vctx != NULL);
		memset(buf, 0xaa, sizeof(buf));
		CHECK(vctx->query_port(ctx, 1, (struct ibv_port_attr *)buf, 20) == 0);
		CHECK(buf[20] == 0xaa && buf[0] == IBV_PORT_ACTIVE);
		memset(buf, 0xaa, sizeof(buf));
		CHECK(vctx->query_port(ctx, 1, (struct ibv_port_attr *)buf, 64) == 0);
		CHECK(buf[63] == 0 && buf[64] == 0xaa);
#undef ibv_query_port
		memset(buf, 0xaa, sizeof(buf));
		CHECK(ibv_query_port(ctx, 1, (struct _compat_ibv_port_attr *)buf) == 0);
		CHECK(buf[0] == IBV_PORT_ACTIVE && buf[47] != 0xaa && buf[48] == 0xaa);
	}

	/* GID entries: flags, short entry sizes, small tables. */
	{
		struct ibv_gid_entry e[4];
		CHECK(ibv_query_gid_ex(ctx, 1, 0, &e[0], 0) == 0);
		CHECK(e[0].gid_type == IBV_GID_TYPE_ROCE_V2 && e[0].port_num == 1);
		CHECK(ibv_query_gid_ex(ctx, 1, 0, &e[0], 1) == EINVAL);
		CHECK(_ibv_query_gid_ex(ctx, 1, 0, &e[0], 0, 8) == EINVAL);
		CHECK(ibv_query_gid_ex(ctx, 1, 99, &e[0], 0) == EINVAL);
		CHECK(ibv_query_gid_table(ctx, e, 4, 0) == 1);
		CHECK(ibv_query_gid_table(ctx, e, 0, 0) == -EINVAL);
		CHECK(ibv_query_gid_table(ctx, e, 4, 1) == -EINVAL);
		CHECK(_ibv_query_gid_table(ctx, e, 4, 0, 8) == -EINVAL);
	}

	/* PD and MR. */
	FAILS_PTR(ibv_alloc_pd(NULL), EINVAL);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_pd *opd = ibv_alloc_pd(other);
	CHECK(pd && opd && pd->context == ctx);
	char *buf = calloc(1, 8192);
	FAILS_PTR(ibv_reg_mr(NULL, buf, 4096, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	FAILS_PTR(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	FAILS_PTR(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE), EINVAL);
	FAILS_PTR(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, 3, IBV_ACCESS_LOCAL_WRITE), EOPNOTSUPP);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
				       IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mr && mr->addr == buf && mr->length == 8192 && mr->pd == pd);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_dealloc_pd(NULL) == EINVAL);
	CHECK(ibv_dereg_mr(NULL) == EINVAL);

	/* On-demand paging: the capabilities, a region over a hole, an implicit one, and
	 * ibv_advise_mr's checks. */
	struct ibv_device_attr_ex dx;
	memset(&dx, 0, sizeof(dx));
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0);
	CHECK(dx.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT));
	CHECK((dx.odp_caps.per_transport_caps.rc_odp_caps & 0x3f) == 0x3f);
	CHECK(dx.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
	long pg = sysconf(_SC_PAGESIZE);
	char *odp_mem = mmap(NULL, 3 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			     -1, 0);
	CHECK(odp_mem != MAP_FAILED);
	/* A hole: an inaccessible page over the middle one (the range stays this program's). */
	CHECK(mmap(odp_mem + pg, pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
	      odp_mem + pg);
	struct ibv_mr *odp = ibv_reg_mr(pd, odp_mem, 3 * pg,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(odp && odp->addr == odp_mem && odp->length == (size_t)(3 * pg));
	struct ibv_sge as = { .addr = (uintptr_t)odp_mem, .length = (uint32_t)pg,
			      .lkey = odp->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			    IBV_ADVISE_MR_FLAG_FLUSH, &as, 1) == 0);
	as.length = (uint32_t)(3 * pg);
	/* Over the hole: a hint without FLUSH, EFAULT with it, unless NO_FAULT. */
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &as, 1) == 0);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &as, 1) ==
	      EFAULT);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH,
			    &as, 1) == 0);
	CHECK(ibv_advise_mr(pd, 7, 0, &as, 1) == EOPNOTSUPP);
	CHECK(ibv_advise_mr(pd, 7, 0, &as, 0) == EINVAL); /* (arguments before the advice) */
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &as, 1) == EINVAL);
	CHECK(ibv_advise_mr(opd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &as, 1) == EINVAL);
	as.lkey = mr->lkey; /* not on demand */
	as.addr = (uintptr_t)buf;
	as.length = 64;
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &as, 1) == EINVAL);
	struct ibv_mr *implicit = ibv_reg_mr(pd, NULL, SIZE_MAX,
					     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	CHECK(implicit && implicit->addr == NULL && implicit->length == SIZE_MAX);
	as.lkey = implicit->lkey; /* any mapped address */
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &as, 1) == 0);
	FAILS_PTR(ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	CHECK(ibv_dereg_mr(implicit) == 0 && ibv_dereg_mr(odp) == 0);
	munmap(odp_mem, 3 * pg);

	/* Completion channels and CQs. */
	FAILS_PTR(ibv_create_comp_channel(NULL), EINVAL);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_comp_channel *och = ibv_create_comp_channel(other);
	CHECK(ch && och && ch->fd >= 0 && ch->context == ctx);
	FAILS_PTR(ibv_create_cq(NULL, 16, NULL, NULL, 0), EINVAL);
	FAILS_PTR(ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL);
	FAILS_PTR(ibv_create_cq(ctx, -1, NULL, NULL, 0), EINVAL);
	FAILS_PTR(ibv_create_cq(ctx, 1 << 30, NULL, NULL, 0), EINVAL);
	FAILS_PTR(ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors), EINVAL);
	FAILS_PTR(ibv_create_cq(ctx, 16, NULL, och, 0), EINVAL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	struct ibv_cq *ocq = ibv_create_cq(other, 16, NULL, NULL, 0);
	CHECK(cq && ocq && cq->cqe >= 16 && cq->cq_context == (void *)0x1234 &&
	      cq->channel == ch && cq->context == ctx);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
	CHECK(ibv_resize_cq(cq, 0) == EINVAL);
	CHECK(ibv_resize_cq(cq, 8) == 0);
	struct ibv_wc wc[4];
	CHECK(ibv_poll_cq(cq, 0, wc) == 0);
	CHECK(ibv_req_notify_cq(ocq, 0) == 0); /* no channel: accepted, nothing to notify */
	CHECK(ibv_poll_cq(cq, 4, wc) == 0);
	{
		struct ibv_cq *ecq;
		void *ectx;
		int fl = fcntl(ch->fd, F_GETFL);
		CHECK(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
		errno = 0;
		CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN);
		fl = fcntl(ctx->async_fd, F_GETFL);
		CHECK(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
		struct ibv_async_event ae;
		errno = 0;
		CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN);
	}

	/* QPs: NULLs, objects of another context, limits, types. */
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
	};
	FAILS_PTR(ibv_create_qp(NULL, &ia), EINVAL);
	FAILS_PTR(ibv_create_qp(pd, NULL), EINVAL);
	ia.send_cq = ocq;
	FAILS_PTR(ibv_create_qp(pd, &ia), EINVAL);
	ia.send_cq = NULL;
	FAILS_PTR(ibv_create_qp(pd, &ia), EINVAL);
	ia.send_cq = cq;
	ia.cap.max_send_wr = 1 << 30;
	FAILS_PTR(ibv_create_qp(pd, &ia), EINVAL);
	ia.cap.max_send_wr = 8;
	ia.cap.max_send_sge = 1 << 20;
	FAILS_PTR(ibv_create_qp(pd, &ia), EINVAL);
	ia.cap.max_send_sge = 2;
	ia.qp_type = 77;
	FAILS_PTR(ibv_create_qp(pd, &ia), EINVAL);
	ia.qp_type = IBV_QPT_RC;
	ia.qp_context = (void *)0x5678;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_qp *qp2 = ibv_create_qp(pd, &ia);
	CHECK(qp && qp2 && qp->state == IBV_QPS_RESET && qp->qp_context == (void *)0x5678);
	CHECK(qp->pd == pd && qp->send_cq == cq && qp->context == ctx && qp->qp_num != 0);
	CHECK(ia.cap.max_send_wr >= 8 && ia.cap.max_send_sge >= 2);
	CHECK(ibv_destroy_cq(cq) == EBUSY);

	/* Posting to a QP in RESET. */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad = NULL;
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *rbad = NULL;
	CHECK(ibv_post_send(qp, &swr, &bad) == EINVAL && bad == &swr);
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr);

	/* modify_qp: skipped state, missing and unknown attributes. */
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	CHECK(ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL);
	qa.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL);
	CHECK(ibv_modify_qp(qp, &qa, IBV_QP_STATE | (1 << 30)) == EOPNOTSUPP);
	CHECK(ibv_modify_qp(qp, &qa, IBV_QP_STATE | (1 << 22)) == EINVAL);
	qa.qp_state = 42;
	CHECK(ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL);
	CHECK(ibv_modify_qp(qp, NULL, IBV_QP_STATE) == EINVAL);
	CHECK(qp->state == IBV_QPS_RESET);

	/* A loopback connection: two QPs of one device, to RTS. */
	CHECK(to_rts(qp, qp2->qp_num, &gid) == 0);
	CHECK(to_rts(qp2, qp->qp_num, &gid) == 0);
	CHECK(qp->state == IBV_QPS_RTS);
	{
		struct ibv_qp_attr q;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi) == 0);
		CHECK(q.qp_state == IBV_QPS_RTS && q.dest_qp_num == qp2->qp_num);
		CHECK(qi.qp_context == (void *)0x5678 && qi.send_cq == cq && qi.qp_type == IBV_QPT_RC);
		CHECK(ibv_query_qp(qp, NULL, 0, &qi) == EINVAL);
	}

	/* Linked lists: the bad request is named, the ones before it are posted. */
	struct ibv_recv_wr r2 = rwr;
	r2.wr_id = 20;
	CHECK(ibv_post_recv(qp2, &r2, &rbad) == 0);
	struct ibv_send_wr s1 = swr, s2 = swr;
	struct ibv_sge many[8];
	for (int i = 0; i < 8; i++)
		many[i] = sge;
	s1.next = &s2;
	s2.wr_id = 2;
	s2.sg_list = many;
	s2.num_sge = 8; /* above max_send_sge */
	bad = NULL;
	CHECK(ibv_post_send(qp, &s1, &bad) == EINVAL && bad == &s2);
	s2.num_sge = 1;
	s2.opcode = 99;
	bad = NULL;
	CHECK(ibv_post_send(qp, &s2, &bad) == EINVAL && bad == &s2);
	s2.num_sge = -1;
	s2.opcode = IBV_WR_SEND;
	CHECK(ibv_post_send(qp, &s2, &bad) == EINVAL && bad == &s2);
	/* The first SEND completes at both ends. */
	{
		int got = 0, spins = 0;
		while (got < 2 && spins++ < 2000000) {
			int n = ibv_poll_cq(cq, 4, wc);
			CHECK(n >= 0);
			for (int i = 0; i < n; i++) {
				CHECK(wc[i].status == IBV_WC_SUCCESS);
				CHECK(wc[i].wr_id == 1 || wc[i].wr_id == 20);
			}
			got += n;
		}
		CHECK(got == 2);
	}
	/* Inline data need not be registered (rdma-core ignores the lkey). */
	{
		char msg[16] = "inline";
		struct ibv_sge is = { .addr = (uintptr_t)msg, .length = sizeof(msg), .lkey = 0 };
		struct ibv_send_wr iw = { .wr_id = 3, .sg_list = &is, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
		struct ibv_qp_attr q;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(qp, &q, IBV_QP_CAP, &qi) == 0);
		CHECK(qi.cap.max_inline_data >= sizeof(msg));
		{
			r2.wr_id = 21;
			CHECK(ibv_post_recv(qp2, &r2, &rbad) == 0);
			CHECK(ibv_post_send(qp, &iw, &bad) == 0);
			int got = 0, spins = 0;
			while (got < 2 && spins++ < 2000000) {
				int n = ibv_poll_cq(cq, 4, wc);
				for (int i = 0; i < n; i++)
					CHECK(wc[i].status == IBV_WC_SUCCESS);
				got += n;
			}
			CHECK(got == 2 && !strcmp(buf, "inline"));
		}
	}

	/* Each opcode through the ops table: the wr unions are read as the header lays
	 * them out, immediate data stays in network order end to end. */
	{
		struct ibv_sge ls = { .addr = (uintptr_t)buf + 100, .length = 16, .lkey = mr->lkey };
		struct ibv_sge rs = { .addr = (uintptr_t)buf + 512, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr rr = { .wr_id = 50, .sg_list = &rs, .num_sge = 1 };
		struct ibv_send_wr w = { .wr_id = 60, .sg_list = &ls, .num_sge = 1,
					 .send_flags = IBV_SEND_SIGNALED };
		struct ibv_wc c[2], *x;
		uint64_t *atom = (uint64_t *)(buf + 4096), *res = (uint64_t *)(buf + 4104);

		strcpy(buf + 100, "payload-16bytes");
		CHECK(ibv_post_recv(qp2, &rr, &rbad) == 0);
		w.opcode = IBV_WR_SEND_WITH_IMM;
		w.imm_data = htobe32(0x12345678);
		CHECK(ibv_post_send(qp, &w, &bad) == 0);
		wait_wcs(cq, 2, c);
		x = find_wc(c, 2, IBV_WC_RECV);
		CHECK((x->wc_flags & IBV_WC_WITH_IMM) && be32toh(x->imm_data) == 0x12345678);
		CHECK(x->byte_len == 16 && x->qp_num == qp2->qp_num && x->wr_id == 50);
		CHECK(!strcmp(buf + 512, "payload-16bytes"));
		CHECK(find_wc(c, 2, IBV_WC_SEND)->qp_num == qp->qp_num);

		w.opcode = IBV_WR_RDMA_WRITE;
		w.wr.rdma.remote_addr = (uintptr_t)buf + 1024;
		w.wr.rdma.rkey = mr->rkey;
		CHECK(ibv_post_send(qp, &w, &bad) == 0);
		wait_wcs(cq, 1, c);
		CHECK(c[0].opcode == IBV_WC_RDMA_WRITE && !strcmp(buf + 1024, "payload-16bytes"));

		CHECK(ibv_post_recv(qp2, &rr, &rbad) == 0);
		w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		w.wr.rdma.remote_addr = (uintptr_t)buf + 1100;
		w.imm_data = htobe32(7);
		CHECK(ibv_post_send(qp, &w, &bad) == 0);
		wait_wcs(cq, 2, c);
		x = find_wc(c, 2, IBV_WC_RECV_RDMA_WITH_IMM);
		CHECK(be32toh(x->imm_data) == 7 && !strcmp(buf + 1100, "payload-16bytes"));

		strcpy(buf + 2048, "read-me");
		ls.addr = (uintptr_t)buf + 3000;
		w.opcode = IBV_WR_RDMA_READ;
		w.wr.rdma.remote_addr = (uintptr_t)buf + 2048;
		CHECK(ibv_post_send(qp, &w, &bad) == 0);
		wait_wcs(cq, 1, c);
		CHECK(c[0].opcode == IBV_WC_RDMA_READ && !strcmp(buf + 3000, "read-me"));

		*atom = 5;
		ls.addr = (uintptr_t)res;
		ls.length = 8;
		w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		w.wr.atomic.remote_addr = (uintptr_t)atom;
		w.wr.atomic.rkey = mr->rkey;
		w.wr.atomic.compare_add = 3;
		CHECK(ibv_post_send(qp, &w, &bad) == 0);
		wait_wcs(cq, 1, c);
		CHECK(c[0].opcode == IBV_WC_FETCH_ADD && *res == 5 && *atom == 8);
		w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		w.wr.atomic.compare_add = 8;
		w.wr.atomic.swap = 42;
		CHECK(ibv_post_send(qp, &w, &bad) == 0);
		wait_wcs(cq, 1, c);
		CHECK(c[0].opcode == IBV_WC_COMP_SWAP && *res == 8 && *atom == 42);
	}

	/* Multicast needs a UD QP and a multicast GID. */
	CHECK(ibv_attach_mcast(qp, &gid, 0) == EINVAL);
	CHECK(ibv_attach_mcast(NULL, &gid, 0) == EINVAL);

	/* Memory windows (bound and used in tests/c/mem_windows.c): an unknown type is
	 * EINVAL; a type 2 window cannot go through ibv_bind_mw. */
	FAILS_PTR(ibv_alloc_mw(pd, (enum ibv_mw_type)3), EINVAL);
	{
		struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		struct ibv_mw_bind mb;
		memset(&mb, 0, sizeof(mb));
		CHECK(mw != NULL && mw->pd == pd && mw->type == IBV_MW_TYPE_2);
		CHECK(ibv_bind_mw(qp, mw, &mb) == EINVAL);
		CHECK(ibv_dealloc_mw(mw) == 0);
	}

	/* A UD QP joins an IPv4-mapped multicast group; destroy waits for the detach. */
	{
		struct ibv_qp_init_attr ua = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		struct ibv_qp *uqp = ibv_create_qp(pd, &ua);
		union ibv_gid mg = { .raw = { [10] = 0xff, [11] = 0xff, [12] = 239, [13] = 1,
					      [14] = 2, [15] = 3 } };
		CHECK(uqp != NULL);
		CHECK(ibv_attach_mcast(uqp, &gid, 0) == EINVAL); /* not a multicast GID */
		CHECK(ibv_detach_mcast(uqp, &mg, 0) == EINVAL); /* not attached */
		CHECK(ibv_attach_mcast(uqp, &mg, 0) == 0);
		CHECK(ibv_destroy_qp(uqp) == EBUSY);
		CHECK(ibv_detach_mcast(uqp, &mg, 0) == 0);
		CHECK(ibv_destroy_qp(uqp) == 0);
	}

	/* Address handles: RoCE needs a GRH. */
	struct ibv_ah_attr aa = { .port_num = 1 };
	FAILS_PTR(ibv_create_ah(pd, &aa), EINVAL);
	FAILS_PTR(ibv_create_ah(NULL, &aa), EINVAL);
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah && ah->pd == pd);
	CHECK(ibv_destroy_ah(ah) == 0);

	/* SRQs. */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	FAILS_PTR(ibv_create_srq(NULL, &si), EINVAL);
	FAILS_PTR(ibv_create_srq(pd, NULL), EINVAL);
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq && si.attr.max_wr >= 16);
	struct ibv_srq_attr sa = { .srq_limit = 1 << 20 };
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == EINVAL);
	CHECK(ibv_query_srq(srq, &sa) == 0 && sa.max_wr >= 16);
	CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == 0);

	/* Asynchronous events name the C object: a QP on the SRQ moved to ERR raises
	 * LAST_WQE_REACHED; the QP cannot be destroyed until the event is acknowledged. */
	{
		struct ibv_qp_init_attr sia = {
			.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1, .max_send_sge = 1 },
		};
		struct ibv_qp *sqp = ibv_create_qp(pd, &sia);
		CHECK(sqp && sqp->srq == srq);
		struct ibv_qp_attr ea = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
		CHECK(ibv_modify_qp(sqp, &ea, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					      IBV_QP_ACCESS_FLAGS) == 0);
		ea.qp_state = IBV_QPS_ERR;
		CHECK(ibv_modify_qp(sqp, &ea, IBV_QP_STATE) == 0 && sqp->state == IBV_QPS_ERR);
		struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
		CHECK(poll(&pfd, 1, 30000) == 1); /* a hang guard, not a timing check */
		struct ibv_async_event ae;
		CHECK(ibv_get_async_event(ctx, &ae) == 0);
		CHECK(ae.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ae.element.qp == sqp);
		CHECK(!strcmp(ibv_event_type_str(ae.event_type), "last WQE reached"));
		CHECK(ibv_destroy_qp(sqp) == EBUSY);
		ibv_ack_async_event(&ae);
		CHECK(ibv_destroy_qp(sqp) == 0);
	}

	/* Strings and rates. */
	CHECK(!strcmp(ibv_wc_status_str(IBV_WC_SUCCESS), "success"));
	CHECK(!strcmp(ibv_wc_status_str(999), "unknown"));
	CHECK(!strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "PORT_ACTIVE"));
	CHECK(ibv_rate_to_mult(IBV_RATE_10_GBPS) == 4 && mult_to_ibv_rate(4) == IBV_RATE_10_GBPS);
	CHECK(ibv_rate_to_mbps(IBV_RATE_25_GBPS) == 25781 && mbps_to_ibv_rate(2500) == IBV_RATE_2_5_GBPS);
	CHECK(ibv_rate_to_mult(1234) == -1 && mbps_to_ibv_rate(1) == IBV_RATE_MAX);
	CHECK(ibv_fork_init() == 0 && ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);

	/* Teardown in order; each destroy reports dependants with EBUSY until they go. */
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(qp2) == 0);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_cq(ocq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0 && ibv_destroy_comp_channel(och) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(opd) == 0);
	CHECK(ibv_close_device(ctx) == 0 && ibv_close_device(other) == 0);
	free(buf);
	printf("ok %d checks\n", checks);
	return 0;
}
