/*
 * The extended verbs API over the drop-in libibverbs in one process: two RC QPs made by
 * ibv_create_qp_ex with send_ops_flags, connected to each other over the loopback device
 * named by argv[1]; work posted with the ibv_wr_* builders (SEND with an SGE list, RDMA
 * WRITE, SEND with immediate and inline data, RDMA READ, fetch-and-add, compare-and-swap,
 * an aborted batch, a batch failed by a bad setter), UD SENDs with ibv_wr_set_ud_addr;
 * completions read with ibv_start_poll/ibv_next_poll and the ibv_wc_read_* readers of an
 * ibv_cq_ex; ibv_query_device_ex; and the answers for what the extended API does not offer
 * here (NULL from ibv_qp_to_qp_ex on plain QPs, EOPNOTSUPP for a timestamp CQ and a TSO
 * QP). Prints "ex_api: ok" on success.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "test_util.h"

enum { BUF = 4096 };

static struct ibv_qp *make_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq_ex *cq)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	a.send_cq = ibv_cq_ex_to_cq(cq);
	a.recv_cq = ibv_cq_ex_to_cq(cq);
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = pd;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			   IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
			   IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	CHECK(qp, "ibv_create_qp_ex");
	CHECK(a.cap.max_inline_data >= 64, "max_inline_data %u", a.cap.max_inline_data);
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	connect_rc_qp(qp, dest, gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			     IBV_ACCESS_REMOTE_ATOMIC);
}

struct seen {
	uint64_t wr_id;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, imm;
	unsigned flags;
};

/* Reads completions until n are in; each must be successful. */
static void poll_n(struct ibv_cq_ex *cq, struct seen *out, int n)
{
	struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
	int got = 0;
	while (got < n) {
		int ret = ibv_start_poll(cq, &pa);
		if (ret == ENOENT)
			continue;
		CHECK(ret == 0, "ibv_start_poll %d", ret);
		do {
			CHECK(cq->status == IBV_WC_SUCCESS, "wr_id %llu status %s",
			      (unsigned long long)cq->wr_id, ibv_wc_status_str(cq->status));
			out[got].wr_id = cq->wr_id;
			out[got].opcode = ibv_wc_read_opcode(cq);
			out[got].byte_len = ibv_wc_read_byte_len(cq);
			out[got].qp_num = ibv_wc_read_qp_num(cq);
			out[got].flags = ibv_wc_read_wc_flags(cq);
			out[got].imm = (out[got].flags & IBV_WC_WITH_IMM) ?
				ntohl(ibv_wc_read_imm_data(cq)) : 0;
			got++;
			if (got == n)
				break;
			ret = ibv_next_poll(cq);
		} while (ret == 0);
		CHECK(ret == 0 || ret == ENOENT, "ibv_next_poll %d", ret);
		ibv_end_poll(cq);
	}
}

static struct seen *find(struct seen *s, int n, uint64_t wr_id)
{
	for (int i = 0; i < n; i++)
		if (s[i].wr_id == wr_id)
			return &s[i];
	fprintf(stderr, "no completion for wr_id %llu\n", (unsigned long long)wr_id);
	exit(1);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2, "usage: ex_api DEVICE");
	struct ibv_device **list;
	struct ibv_context *ctx = open_device_named(argv[1], &list);
	ibv_free_device_list(list);

	/* ibv_query_device_ex through the verbs_context slot. */
	struct ibv_device_attr_ex dx;
	memset(&dx, 0xa5, sizeof(dx));
	CHECK(!ibv_query_device_ex(ctx, NULL, &dx), "ibv_query_device_ex");
	CHECK(dx.orig_attr.max_qp_wr > 0 && dx.orig_attr.phys_port_cnt == 1,
	      "orig_attr: max_qp_wr %d ports %d", dx.orig_attr.max_qp_wr, dx.orig_attr.phys_port_cnt);
	CHECK(dx.comp_mask == 0 &&
	      dx.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) &&
	      dx.phys_port_cnt_ex == 1,
	      "extended attributes: comp_mask %u odp %llu ports %u", dx.comp_mask,
	      (unsigned long long)dx.odp_caps.general_caps, dx.phys_port_cnt_ex);
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &dx) == EINVAL, "input comp_mask");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	char *a_buf = calloc(1, BUF), *b_buf = calloc(1, BUF);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *a_mr = ibv_reg_mr(pd, a_buf, BUF, acc);
	struct ibv_mr *b_mr = ibv_reg_mr(pd, b_buf, BUF, acc);
	CHECK(a_mr && b_mr, "ibv_reg_mr");

	/* A timestamp is not something this device can give. */
	struct ibv_cq_init_attr_ex ca;
	memset(&ca, 0, sizeof(ca));
	ca.cqe = 64;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP, "timestamp CQ");
	ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &ca);
	CHECK(cq, "ibv_create_cq_ex");
	CHECK(ibv_cq_ex_to_cq(cq)->cqe >= 64, "cqe %d", ibv_cq_ex_to_cq(cq)->cqe);

	struct ibv_qp *qa = make_qp(ctx, pd, cq), *qb = make_qp(ctx, pd, cq);
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
	connect_qp(qa, qb->qp_num, &gid);
	connect_qp(qb, qa->qp_num, &gid);

	/* Two receives at B: for the SEND and for the SEND with immediate. */
	for (int i = 0; i < 2; i++) {
		struct ibv_sge s = { (uintptr_t)(b_buf + 1024 * i), 1024, b_mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		CHECK(!ibv_post_recv(qb, &r, &bad), "ibv_post_recv");
	}

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qa);
	CHECK(qx && &qx->qp_base == qa, "ibv_qp_to_qp_ex");

	/* An aborted batch posts nothing. */
	ibv_wr_start(qx);
	qx->wr_id = 99;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, a_mr->lkey, (uintptr_t)a_buf, 8);
	ibv_wr_abort(qx);

	strcpy(a_buf, "hello through ibv_wr_send");
	strcpy(a_buf + 512, "written by ibv_wr_rdma_write");
	char inl[32] = "inline with immediate";
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	struct ibv_sge two[2] = { { (uintptr_t)a_buf, 6, a_mr->lkey },
				  { (uintptr_t)a_buf + 6, 20, a_mr->lkey } };
	ibv_wr_set_sge_list(qx, 2, two);
	qx->wr_id = 2;
	ibv_wr_rdma_write(qx, b_mr->rkey, (uintptr_t)b_buf + 3000);
	ibv_wr_set_sge(qx, a_mr->lkey, (uintptr_t)a_buf + 512, 29);
	qx->wr_id = 3;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send_imm(qx, htonl(0x12345678));
	struct ibv_data_buf parts[2] = { { inl, 7 }, { inl + 7, 15 } };
	ibv_wr_set_inline_data_list(qx, 2, parts);
	memset(inl, 'X', sizeof(inl)); /* inline data was copied by the setter */
	qx->wr_id = 4;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qx, b_mr->rkey, (uintptr_t)b_buf + 3000);
	ibv_wr_set_sge(qx, a_mr->lkey, (uintptr_t)a_buf + 2048, 29);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete");

	struct seen s[8];
	poll_n(cq, s, 6);
	struct seen *c;
	c = find(s, 6, 1);
	CHECK(c->opcode == IBV_WC_SEND && c->qp_num == qa->qp_num, "send completion");
	c = find(s, 6, 2);
	CHECK(c->opcode == IBV_WC_RDMA_WRITE, "write completion");
	c = find(s, 6, 3);
	CHECK(c->opcode == IBV_WC_SEND, "send_imm completion");
	c = find(s, 6, 4);
	CHECK(c->opcode == IBV_WC_RDMA_READ && c->byte_len == 29, "read completion");
	c = find(s, 6, 100);
	CHECK(c->opcode == IBV_WC_RECV && c->byte_len == 26 && c->qp_num == qb->qp_num &&
	      !(c->flags & IBV_WC_WITH_IMM), "recv: opcode %d len %u", c->opcode, c->byte_len);
	c = find(s, 6, 101);
	CHECK(c->opcode == IBV_WC_RECV && c->byte_len == 22 && (c->flags & IBV_WC_WITH_IMM) &&
	      c->imm == 0x12345678, "recv with imm: len %u imm %#x", c->byte_len, c->imm);
	CHECK(!strcmp(b_buf, "hello through ibv_wr_send"), "sent data: %s", b_buf);
	CHECK(!strcmp(b_buf + 3000, "written by ibv_wr_rdma_write"), "written data");
	CHECK(!strcmp(a_buf + 2048, "written by ibv_wr_rdma_write"), "read data");
	/* Nothing else: the aborted batch posted nothing. */
	struct ibv_poll_cq_attr pa0 = { .comp_mask = 0 };
	CHECK(ibv_start_poll(cq, &pa0) == ENOENT, "a completion too many");
	CHECK(!memcmp(b_buf + 1024, "inline with immediate", 22), "inline data");

	/* Atomics: fetch-and-add then compare-and-swap on one 8-byte word at B. */
	uint64_t *word = (uint64_t *)(b_buf + 3072), *old = (uint64_t *)(a_buf + 3072);
	*word = 40;
	ibv_wr_start(qx);
	qx->wr_id = 5;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(qx, b_mr->rkey, (uintptr_t)word, 2);
	ibv_wr_set_sge(qx, a_mr->lkey, (uintptr_t)old, 8);
	qx->wr_id = 6;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
	ibv_wr_atomic_cmp_swp(qx, b_mr->rkey, (uintptr_t)word, 42, 7);
	ibv_wr_set_sge(qx, a_mr->lkey, (uintptr_t)(old + 1), 8);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete (atomics)");
	poll_n(cq, s, 2);
	c = find(s, 2, 5);
	CHECK(c->opcode == IBV_WC_FETCH_ADD, "fetch_add completion");
	c = find(s, 2, 6);
	CHECK(c->opcode == IBV_WC_COMP_SWAP, "cmp_swp completion");
	CHECK(old[0] == 40 && old[1] == 42 && *word == 7, "atomics: %llu %llu %llu",
	      (unsigned long long)old[0], (unsigned long long)old[1], (unsigned long long)*word);

	/* A builder's error (an SGE list longer than max_send_sge) fails the whole batch. */
	ibv_wr_start(qx);
	qx->wr_id = 7;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, a_mr->lkey, (uintptr_t)a_buf, 8);
	qx->wr_id = 8;
	ibv_wr_send(qx);
	struct ibv_sge three[3] = { two[0], two[1], two[0] };
	ibv_wr_set_sge_list(qx, 3, three);
	CHECK(ibv_wr_complete(qx) == EINVAL, "ibv_wr_complete with a bad SGE list");

	/* UD: SEND with ibv_wr_set_ud_addr to a second UD QP, GRH in front of the data. */
	struct ibv_qp_init_attr_ex ua;
	memset(&ua, 0, sizeof(ua));
	ua.send_cq = ua.recv_cq = ibv_cq_ex_to_cq(cq);
	ua.qp_type = IBV_QPT_UD;
	ua.cap.max_send_wr = ua.cap.max_recv_wr = 4;
	ua.cap.max_send_sge = ua.cap.max_recv_sge = 1;
	ua.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ua.pd = pd;
	ua.send_ops_flags = IBV_QP_EX_WITH_SEND;
	struct ibv_qp *ud[2];
	for (int i = 0; i < 2; i++) {
		ud[i] = ibv_create_qp_ex(ctx, &ua);
		CHECK(ud[i], "UD ibv_create_qp_ex");
		struct ibv_qp_attr at;
		memset(&at, 0, sizeof(at));
		at.qp_state = IBV_QPS_INIT;
		at.port_num = 1;
		at.qkey = 0x11111111;
		CHECK(!ibv_modify_qp(ud[i], &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_QKEY), "UD INIT");
		at.qp_state = IBV_QPS_RTR;
		CHECK(!ibv_modify_qp(ud[i], &at, IBV_QP_STATE), "UD RTR");
		at.qp_state = IBV_QPS_RTS;
		at.sq_psn = 0;
		CHECK(!ibv_modify_qp(ud[i], &at, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
	}
	memset(b_buf, 0, 256);
	struct ibv_sge us = { (uintptr_t)b_buf, 256, b_mr->lkey };
	struct ibv_recv_wr ur = { .wr_id = 200, .sg_list = &us, .num_sge = 1 }, *ubad;
	CHECK(!ibv_post_recv(ud[1], &ur, &ubad), "UD ibv_post_recv");
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 1;
	aa.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "ibv_create_ah");
	struct ibv_qp_ex *ux = ibv_qp_to_qp_ex(ud[0]);
	CHECK(ux, "UD ibv_qp_to_qp_ex");
	strcpy(a_buf, "a datagram");
	ibv_wr_start(ux);
	ux->wr_id = 9;
	ux->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ux);
	ibv_wr_set_ud_addr(ux, ah, ud[1]->qp_num, 0x11111111);
	ibv_wr_set_sge(ux, a_mr->lkey, (uintptr_t)a_buf, 11);
	CHECK(ibv_wr_complete(ux) == 0, "UD ibv_wr_complete");
	poll_n(cq, s, 2);
	c = find(s, 2, 9);
	CHECK(c->opcode == IBV_WC_SEND, "UD send completion");
	c = find(s, 2, 200);
	CHECK(c->opcode == IBV_WC_RECV && c->byte_len == 40 + 11 && c->qp_num == ud[1]->qp_num,
	      "UD receive: len %u", c->byte_len);
	CHECK(!strcmp(b_buf + 40, "a datagram"), "UD data");
	CHECK(!ibv_destroy_ah(ah) && !ibv_destroy_qp(ud[0]) && !ibv_destroy_qp(ud[1]), "UD teardown");

	/* A QP made without the extended flags has no ibv_qp_ex. */
	struct ibv_qp_init_attr pa;
	memset(&pa, 0, sizeof(pa));
	pa.send_cq = pa.recv_cq = ibv_cq_ex_to_cq(cq);
	pa.qp_type = IBV_QPT_RC;
	pa.cap.max_send_wr = pa.cap.max_recv_wr = 1;
	pa.cap.max_send_sge = pa.cap.max_recv_sge = 1;
	struct ibv_qp *plain = ibv_create_qp(pd, &pa);
	CHECK(plain, "ibv_create_qp");
	CHECK(ibv_qp_to_qp_ex(plain) == NULL, "ibv_qp_to_qp_ex on a plain QP");
	/* Nor does one from ibv_create_qp_ex with the PD alone (the inline shortcut). */
	struct ibv_qp_init_attr_ex px;
	memset(&px, 0, sizeof(px));
	px.send_cq = px.recv_cq = ibv_cq_ex_to_cq(cq);
	px.qp_type = IBV_QPT_RC;
	px.cap = pa.cap;
	px.comp_mask = IBV_QP_INIT_ATTR_PD;
	px.pd = pd;
	struct ibv_qp *plain2 = ibv_create_qp_ex(ctx, &px);
	CHECK(plain2 && ibv_qp_to_qp_ex(plain2) == NULL, "PD-only ibv_create_qp_ex");
	/* A builder the device cannot honour fails at creation. */
	px.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	px.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO;
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &px) && errno == EOPNOTSUPP, "TSO QP");

	CHECK(!ibv_destroy_qp(plain) && !ibv_destroy_qp(plain2), "destroy plain QPs");
	CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb), "ibv_destroy_qp");
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), "ibv_destroy_cq");
	CHECK(!ibv_dereg_mr(a_mr) && !ibv_dereg_mr(b_mr), "ibv_dereg_mr");
	CHECK(!ibv_dealloc_pd(pd), "ibv_dealloc_pd");
	CHECK(!ibv_close_device(ctx), "ibv_close_device");
	free(a_buf);
	free(b_buf);
	printf("ex_api: ok\n");
	return 0;
}
