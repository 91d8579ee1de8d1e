/*
 * An MPI program that checks every byte it moves: run by frameworks.rs under Debian's
 * Open MPI (pml ucx, UCX's rc_verbs) on the drop-in libraries, every rank on one softrdma
 * device.
 *
 *   mpi_check [ITERS]
 *
 * 1. Ping-pong between ranks 0 and 1 at sizes from 1 byte to 4 MiB (UCX sends the small
 *    ones eagerly, as SENDs, and fetches the large ones with RDMA READs), each message
 *    filled with a pattern of its size, round and sender, checked whole by the receiver,
 *    with its length (MPI_Get_count), source and tag.
 * 2. A burst: rank 0 starts 64 non-blocking sends of 8 KiB, each with a tag of its own;
 *    rank 1 posts the receives in the reverse order of their tags.
 * 3. Collectives over every rank: Allreduce (sum of 2^16 doubles), Bcast (1 MiB from the
 *    last rank), Alltoall (4 KiB blocks), Barrier.
 * 4. One-sided communication (Open MPI's osc ucx: RDMA WRITEs and READs of UCX's): in a
 *    window of 1 MiB per rank, each rank puts 256 KiB into its right neighbour's and gets
 *    it back from its left neighbour's (fences); then, in a passive epoch, every rank adds
 *    1 to a counter of rank 0's 100 times (MPI_Fetch_and_op), the values fetched, gathered
 *    at rank 0, being each number below 100 * N once; every rank tries to swap its number
 *    into a slot of the last rank's that holds -1 (MPI_Compare_and_swap), exactly one
 *    wins; and MPI_Accumulate sums an array into rank 0's window.
 * Prints one line of one-way times from rank 0 (not checked by the test) and "mpi_check: ok
 * (N ranks)" when every check passed; a failed check prints what differed and aborts.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

#define FAIL(...)                                                                          \
	do {                                                                               \
		fprintf(stderr, "mpi_check: rank %d: ", rank);                             \
		fprintf(stderr, __VA_ARGS__);                                              \
		fprintf(stderr, "\n");                                                     \
		MPI_Abort(MPI_COMM_WORLD, 1);                                              \
	} while (0)

/* The byte at `i` of the message of `len` bytes sent by `from` in round `round`. */
static unsigned char pattern(size_t i, size_t len, int round, int from)
{
	uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)len * 40503u ^ (uint32_t)round * 977u ^
		     (uint32_t)from * 0x9e3779b9u;
	return (unsigned char)(x >> 13 ^ x);
}

static void fill(unsigned char *b, size_t len, int round, int from)
{
	for (size_t i = 0; i < len; i++)
		b[i] = pattern(i, len, round, from);
}

static void check(const unsigned char *b, size_t len, int round, int from, const char *what)
{
	for (size_t i = 0; i < len; i++)
		if (b[i] != pattern(i, len, round, from))
			FAIL("%s: %zu bytes from rank %d, round %d: byte %zu is %u, not %u", what,
			     len, from, round, i, b[i], pattern(i, len, round, from));
}

static void recv_checked(unsigned char *b, size_t len, int from, int tag, int round,
			 const char *what)
{
	MPI_Status st;
	int count;

	memset(b, 0, len);
	MPI_Recv(b, (int)len, MPI_BYTE, from, tag, MPI_COMM_WORLD, &st);
	MPI_Get_count(&st, MPI_BYTE, &count);
	if ((size_t)count != len || st.MPI_SOURCE != from || st.MPI_TAG != tag)
		FAIL("%s: got %d bytes from %d tag %d, expected %zu from %d tag %d", what, count,
		     st.MPI_SOURCE, st.MPI_TAG, len, from, tag);
	check(b, len, round, from, what);
}

static void ping_pong(unsigned char *buf, int iters)
{
	static const size_t sizes[] = {1, 8, 100, 4096, 9000, 65536, 1 << 20, 4 << 20};
	char times[512] = "";

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t len = sizes[s];
		double t0 = 0;

		for (int r = 0; r < iters; r++) {
			if (r == 1)
				t0 = MPI_Wtime(); /* (the first round sets the size up) */
			if (rank == 0) {
				fill(buf, len, r, 0);
				MPI_Send(buf, (int)len, MPI_BYTE, 1, (int)s, MPI_COMM_WORLD);
				recv_checked(buf, len, 1, (int)s, r, "ping-pong answer");
			} else if (rank == 1) {
				recv_checked(buf, len, 0, (int)s, r, "ping-pong request");
				fill(buf, len, r, 1);
				MPI_Send(buf, (int)len, MPI_BYTE, 0, (int)s, MPI_COMM_WORLD);
			}
		}
		if (rank == 0 && iters > 1) {
			size_t n = strlen(times);
			snprintf(times + n, sizeof(times) - n, " %zu B %.1f us;", len,
				 (MPI_Wtime() - t0) / (iters - 1) / 2 * 1e6);
		}
	}
	if (rank == 0)
		printf("mpi_check: ping-pong one-way (with the checks):%s\n", times);
}

static void burst(void)
{
	enum { N = 64, LEN = 8192 };
	unsigned char *b = malloc((size_t)N * LEN);
	MPI_Request req[N];

	if (!b)
		FAIL("out of memory");
	if (rank == 0) {
		for (int k = 0; k < N; k++) {
			fill(b + (size_t)k * LEN, LEN, k, 0);
			MPI_Isend(b + (size_t)k * LEN, LEN, MPI_BYTE, 1, 100 + k, MPI_COMM_WORLD,
				  &req[k]);
		}
		MPI_Waitall(N, req, MPI_STATUSES_IGNORE);
	} else if (rank == 1) {
		memset(b, 0, (size_t)N * LEN);
		for (int k = N - 1; k >= 0; k--)
			MPI_Irecv(b + (size_t)k * LEN, LEN, MPI_BYTE, 0, 100 + k, MPI_COMM_WORLD,
				  &req[N - 1 - k]);
		MPI_Waitall(N, req, MPI_STATUSES_IGNORE);
		for (int k = 0; k < N; k++)
			check(b + (size_t)k * LEN, LEN, k, 0, "burst");
	}
	free(b);
}

static void collectives(unsigned char *buf)
{
	enum { D = 1 << 16, BLOCK = 4096 };
	double *in = malloc(D * sizeof(double)), *sum = malloc(D * sizeof(double));
	unsigned char *to = malloc((size_t)nranks * BLOCK), *from = malloc((size_t)nranks * BLOCK);
	size_t len = 1 << 20;

	if (!in || !sum || !to || !from)
		FAIL("out of memory");
	for (int i = 0; i < D; i++)
		in[i] = (double)(rank + 1) * (i % 1000);
	MPI_Allreduce(in, sum, D, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	for (int i = 0; i < D; i++)
		if (sum[i] != (double)nranks * (nranks + 1) / 2 * (i % 1000))
			FAIL("allreduce: element %d is %g", i, sum[i]);

	if (rank == nranks - 1)
		fill(buf, len, 7, nranks - 1);
	else
		memset(buf, 0, len);
	MPI_Bcast(buf, (int)len, MPI_BYTE, nranks - 1, MPI_COMM_WORLD);
	check(buf, len, 7, nranks - 1, "bcast");

	/* Block j of rank i goes to rank j: the pattern of (BLOCK, round j, sender i). */
	for (int j = 0; j < nranks; j++)
		fill(to + (size_t)j * BLOCK, BLOCK, j, rank);
	memset(from, 0, (size_t)nranks * BLOCK);
	MPI_Alltoall(to, BLOCK, MPI_BYTE, from, BLOCK, MPI_BYTE, MPI_COMM_WORLD);
	for (int i = 0; i < nranks; i++)
		check(from + (size_t)i * BLOCK, BLOCK, rank, i, "alltoall");
	MPI_Barrier(MPI_COMM_WORLD);
	free(in);
	free(sum);
	free(to);
	free(from);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static void one_sided(void)
{
	enum { WIN = 1 << 20, PUT = 256 << 10, ADDS = 100, ACC = 1024 };
	unsigned char *win_mem, *got = malloc(PUT);
	int64_t *fetched = malloc(ADDS * sizeof(int64_t)), *all = NULL;
	int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
	MPI_Win win;

	if (!got || !fetched)
		FAIL("out of memory");
	MPI_Win_allocate(WIN, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win_mem, &win);
	memset(win_mem, 0, WIN);
	/* Counter at 0 (rank 0), swap slot at 8 (last rank), accumulated array from 4096. */
	if (rank == nranks - 1)
		*(int64_t *)(win_mem + 8) = -1;
	MPI_Win_fence(0, win);

	/* Put into the right neighbour's window at offset 64 KiB; get from the left one's. */
	fill(got, PUT, 11, rank);
	MPI_Put(got, PUT, MPI_BYTE, right, 64 << 10, PUT, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	check(win_mem + (64 << 10), PUT, 11, left, "MPI_Put");
	memset(got, 0, PUT);
	MPI_Get(got, PUT, MPI_BYTE, left, 64 << 10, PUT, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	check(got, PUT, 11, (left + nranks - 1) % nranks, "MPI_Get");

	MPI_Win_lock_all(0, win);
	for (int i = 0; i < ADDS; i++) {
		int64_t one = 1;
		MPI_Fetch_and_op(&one, &fetched[i], MPI_INT64_T, 0, 0, MPI_SUM, win);
		MPI_Win_flush(0, win);
	}
	{
		int64_t mine = rank, minus = -1, was = 0;
		MPI_Compare_and_swap(&mine, &minus, &was, MPI_INT64_T, nranks - 1, 8, win);
		MPI_Win_flush(nranks - 1, win);
		int won = was == -1, winners = 0;
		MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (winners != 1)
			FAIL("MPI_Compare_and_swap: %d ranks found the slot empty", winners);
	}
	{
		int64_t add[ACC];
		for (int i = 0; i < ACC; i++)
			add[i] = (int64_t)(rank + 1) * i;
		MPI_Accumulate(add, ACC, MPI_INT64_T, 0, 4096, ACC, MPI_INT64_T, MPI_SUM, win);
	}
	MPI_Win_unlock_all(win);
	MPI_Barrier(MPI_COMM_WORLD);

	if (rank == 0) {
		int64_t *acc = (int64_t *)(win_mem + 4096);
		if (*(int64_t *)win_mem != (int64_t)ADDS * nranks)
			FAIL("MPI_Fetch_and_op: counter %lld, expected %d",
			     (long long)*(int64_t *)win_mem, ADDS * nranks);
		for (int i = 0; i < ACC; i++)
			if (acc[i] != (int64_t)nranks * (nranks + 1) / 2 * i)
				FAIL("MPI_Accumulate: element %d is %lld", i, (long long)acc[i]);
		all = malloc((size_t)ADDS * nranks * sizeof(int64_t));
		if (!all)
			FAIL("out of memory");
	}
	if (rank == nranks - 1) {
		int64_t slot = *(int64_t *)(win_mem + 8);
		if (slot < 0 || slot >= nranks)
			FAIL("MPI_Compare_and_swap: the slot holds %lld", (long long)slot);
	}
	MPI_Gather(fetched, ADDS, MPI_INT64_T, all, ADDS, MPI_INT64_T, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		qsort(all, (size_t)ADDS * nranks, sizeof(int64_t), cmp_i64);
		for (int i = 0; i < ADDS * nranks; i++)
			if (all[i] != i)
				FAIL("MPI_Fetch_and_op: the values fetched, sorted, have %lld at %d",
				     (long long)all[i], i);
		free(all);
	}
	MPI_Win_free(&win);
	free(got);
	free(fetched);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 20;
	unsigned char *buf;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks < 2)
		FAIL("needs at least 2 ranks, has %d", nranks);
	buf = malloc(4 << 20);
	if (!buf)
		FAIL("out of memory");
	ping_pong(buf, iters < 1 ? 1 : iters);
	burst();
	collectives(buf);
	one_sided();
	free(buf);
	if (rank == 0)
		printf("mpi_check: ok (%d ranks)\n", nranks);
	MPI_Finalize();
	return 0;
}
