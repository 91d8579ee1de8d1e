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
	free(buf);
	if (rank == 0)
		printf("mpi_check: ok (%d ranks)\n", nranks);
	MPI_Finalize();
	return 0;
}
