// SPDX-License-Identifier: MIT
/*
 * A frame streamed from its start: for frames too big to decode whole (a
 * plain `zstd FILE` is one frame for the whole file) or without a size.
 * The decoder is kept with its window between reads, so that a read after
 * the last continues where it ended; a read behind it starts the frame
 * over, unless a checkpoint is nearer.
 *
 * A checkpoint is the decoder's whole state at a point of the frame, saved
 * as the stream passes it (every ck_every bytes of content, while its
 * owner finds room): a read behind the stream goes back to the nearest one
 * before it instead of to the frame's start.  zstd keeps the state in one
 * workspace of ours (a static decoder: its window, tables and the pointers
 * into them), so a copy of that workspace is the state, and put back at
 * the same address, it goes on as if it had never left: a checkpoint is
 * restored only into the stream that saved it.  It costs its workspace
 * (the window and about 100 KiB), against decoding on average half the
 * distance between checkpoints.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "zseek_internal.h"

/*
 * The largest window a frame may need, the process's (a daemon serves one
 * dataset): set before the first file is indexed, read-only after.
 */
static uint64_t window_max = ZSEEK_DEFAULT_WINDOW;

void zseek_set_window_max(uint64_t bytes)
{
	if (bytes < (1u << ZSTD_WINDOWLOG_MIN))
		bytes = 1u << ZSTD_WINDOWLOG_MIN;
	window_max = bytes < ZSEEK_LARGEST_WINDOW ? bytes
						  : ZSEEK_LARGEST_WINDOW;
}

uint64_t zseek_window_max(void)
{
	return window_max;
}

/* The stream decoder's limit: the power of two at or above window_max. */
static int window_log_max(void)
{
	int log = ZSTD_WINDOWLOG_MIN;

	while ((1ull << log) < window_max)
		log++;
	return log;
}

/* The checkpoints' positions are read without the stream's owner's lock
 * (zseek_stream_ckpt_below): they are cleared one by one, not by memset. */
static void stream_clear(struct zseek_stream *s)
{
	memset(s, 0, offsetof(struct zseek_stream, ck));
	for (int i = 0; i < ZSEEK_CKPTS; i++) {
		atomic_store(&s->ck[i].pos, 0);
		atomic_store(&s->ck[i].frame, 0);
		s->ck[i].state = NULL;
	}
	s->frame = UINT32_MAX;
}

int zseek_stream_init(struct zseek_stream *s)
{
	stream_clear(s);
	s->in_cap = ZSTD_DStreamInSize();
	s->inbuf = malloc(s->in_cap);
	s->scratch = malloc(ZSTD_BLOCKSIZE_MAX);
	if (!s->inbuf || !s->scratch) {
		zseek_stream_free(s);
		return -ENOMEM;
	}
	return 0;
}

static void state_free(struct zseek_stream *s, void *state)
{
	free(state);
	if (s->ck_give)
		s->ck_give(s->ck_arg, s->ws_size);
}

/* Checkpoint c goes; its memory is kept as the stream's spare if it has
 * none (a save a moment later then takes no fresh pages: places are saved
 * and dropped at every read out of order), given back otherwise. */
static void ckpt_drop(struct zseek_stream *s, struct zseek_ckpt *c)
{
	if (s->place == (int)(c - s->ck) + 1)
		s->place = 0;
	if (!c->state)
		return;
	atomic_store(&c->pos, 0);
	if (!s->spare)
		s->spare = c->state;
	else
		state_free(s, c->state);
	c->state = NULL;
}

void zseek_stream_drop_ckpts(struct zseek_stream *s)
{
	for (int i = 0; i < ZSEEK_CKPTS; i++)
		ckpt_drop(s, &s->ck[i]);
	if (s->spare)
		state_free(s, s->spare);
	s->spare = NULL;
}

void zseek_stream_free(struct zseek_stream *s)
{
	zseek_stream_drop_ckpts(s);
	free(s->ws);
	free(s->inbuf);
	free(s->scratch);
	stream_clear(s);
}

/* zstd's need for a frame of this window and content size: the decoder,
 * one block of input, and its window (decompressStream's own sum). */
static size_t workspace_size(uint64_t window, uint64_t content)
{
	size_t block = window < ZSTD_BLOCKSIZE_MAX ? (size_t)window
						   : ZSTD_BLOCKSIZE_MAX;

	return ZSTD_estimateDCtxSize() + (block > 4 ? block : 4) +
	       ZSTD_decodingBufferSize_min(window, content) + 64;
}

/* The frame's header: 0, or -EBADMSG if it cannot be read or wants too
 * large a window. */
static int frame_header(zseek_read_fn rd, void *ctx,
			const struct zseek_frame *fr, ZSTD_frameHeader *fh)
{
	uint8_t hdr[ZSTD_FRAMEHEADERSIZE_MAX];
	size_t n = fr->c_size < sizeof(hdr) ? (size_t)fr->c_size : sizeof(hdr);

	if (read_exact(rd, ctx, hdr, n, fr->c_off) ||
	    ZSTD_getFrameHeader(fh, hdr, n) || fh->windowSize > window_max)
		return -EBADMSG;
	return 0;
}

/*
 * A decoder in a workspace big enough for fr: the one there if it is, else
 * a new one (and the checkpoints of the old go: they are its state).
 */
static int stream_workspace(struct zseek_stream *s, zseek_read_fn rd,
			    void *ctx, const struct zseek_frame *fr)
{
	ZSTD_frameHeader fh;
	size_t need;
	int r = frame_header(rd, ctx, fr, &fh);

	if (r)
		return r;
	need = workspace_size(fh.windowSize, fh.frameContentSize);
	if (s->ds && s->ws_size >= need)
		return 0;
	zseek_stream_drop_ckpts(s);
	free(s->ws);
	s->ds = NULL;
	s->ws_size = 0;
	s->ws = aligned_alloc(64, (need + 63) & ~(size_t)63);
	if (!s->ws)
		return -ENOMEM;
	s->ws_size = (need + 63) & ~(size_t)63;
	s->ds = ZSTD_initStaticDStream(s->ws, s->ws_size);
	if (!s->ds)
		return -ENOMEM;
	/* the windows allowed, and no more: walk_frame refuses larger */
	ZSTD_DCtx_setParameter(s->ds, ZSTD_d_windowLogMax, window_log_max());
	return 0;
}

/*
 * Start frame fr (number frame) over: 0, or -errno if its first input
 * cannot be read.  That is read here, for the dictionary its header names,
 * only where dictionaries were given.
 */
static int stream_reset(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
			const struct zseek_frame *fr, uint32_t frame)
{
	size_t n = fr->c_size < s->in_cap ? (size_t)fr->c_size : s->in_cap;
	const ZSTD_DDict *dict = NULL;
	int r;

	s->frame = UINT32_MAX;
	r = stream_workspace(s, rd, ctx, fr);
	if (r)
		return r;
	ZSTD_DCtx_reset(s->ds, ZSTD_reset_session_only);
	s->in_off = fr->c_off;
	s->out_pos = 0;
	s->in_pos = s->in_len = 0;
	if (zseek_dict_count()) {
		/* the frame's first input, its header in it, read now */
		r = read_exact(rd, ctx, s->inbuf, n, fr->c_off);
		if (r)
			return r;
		s->in_off += n;
		s->in_len = n;
		dict = zseek_dict_find(ZSTD_getDictID_fromFrame(s->inbuf, n));
	}
	/* NULL drops the last frame's: none is used unless asked for (and
	 * a frame naming one not given fails as dictionary_wrong) */
	if (ZSTD_isError(ZSTD_DCtx_refDDict(s->ds, dict)))
		return -EBADMSG;
	s->frame = frame;
	return 0;
}

/* The nearest checkpoint of frame at or before at, or NULL. */
static struct zseek_ckpt *ckpt_below(struct zseek_stream *s, uint32_t frame,
				     uint64_t at)
{
	struct zseek_ckpt *best = NULL;

	for (int i = 0; i < ZSEEK_CKPTS; i++) {
		struct zseek_ckpt *c = &s->ck[i];
		uint64_t pos = atomic_load(&c->pos);

		if (c->state && pos && pos <= at &&
		    atomic_load(&c->frame) == frame &&
		    (!best || pos > atomic_load(&best->pos)))
			best = c;
	}
	return best;
}

uint64_t zseek_stream_ckpt_below(const struct zseek_stream *s,
				 uint32_t frame, uint64_t at)
{
	uint64_t best = 0;

	/* positions only, without the stream's lock: a hint */
	for (int i = 0; i < ZSEEK_CKPTS; i++) {
		uint64_t pos = atomic_load(&s->ck[i].pos);

		if (pos && pos <= at && pos > best &&
		    atomic_load(&s->ck[i].frame) == frame)
			best = pos;
	}
	return best;
}

/* Save the state where the stream stands in slot c, if the owner finds
 * room: false if not. */
static bool ckpt_save(struct zseek_stream *s, struct zseek_ckpt *c)
{
	if (s->spare) {
		c->state = s->spare;
		s->spare = NULL;
	} else {
		if (s->ck_take && !s->ck_take(s->ck_arg, s->ws_size))
			return false;
		c->state = malloc(s->ws_size);
		if (!c->state) {
			if (s->ck_give)
				s->ck_give(s->ck_arg, s->ws_size);
			return false;
		}
	}
	memcpy(c->state, s->ws, s->ws_size);
	/* what was read and not yet given to zstd is read again */
	c->in_off = s->in_off - (s->in_len - s->in_pos);
	atomic_store(&c->frame, s->frame);
	atomic_store(&c->pos, s->out_pos);
	return true;
}

/* A slot for a save where the stream stands: a free one, else one of
 * another frame's; NULL if that place is saved already, or none is. */
static struct zseek_ckpt *ckpt_slot(struct zseek_stream *s)
{
	struct zseek_ckpt *c = NULL;

	for (int i = 0; i < ZSEEK_CKPTS; i++) {
		struct zseek_ckpt *o = &s->ck[i];

		if (o->state && atomic_load(&o->frame) == s->frame &&
		    atomic_load(&o->pos) == s->out_pos)
			return NULL; /* saved before */
		if (!o->state && !c)
			c = o;
	}
	for (int i = 0; !c && i < ZSEEK_CKPTS; i++)
		if (atomic_load(&s->ck[i].frame) != s->frame) {
			c = &s->ck[i];
			ckpt_drop(s, c);
		}
	return c;
}

/*
 * Save the state where the stream stands, if that is a checkpoint's place
 * (a multiple of ck_every inside the frame) not saved yet and the owner
 * finds room.
 */
static void ckpt_take(struct zseek_stream *s, const struct zseek_frame *fr)
{
	struct zseek_ckpt *c;

	if (!s->ck_every || !s->out_pos || s->out_pos % s->ck_every ||
	    s->out_pos >= fr->d_size)
		return;
	c = ckpt_slot(s);
	if (c)
		ckpt_save(s, c);
}

/*
 * A stream about to go back (another read took it) saves the place it
 * leaves, one such place at a time: the reader it was following, whose
 * next read is there, goes on from it instead of from a checkpoint behind.
 * The place kept before goes, unless it is keep, the one this read is
 * about to go back to (which goes once it has been gone back to).
 */
static void ckpt_keep_place(struct zseek_stream *s,
			    const struct zseek_ckpt *keep)
{
	struct zseek_ckpt *c;

	/* (with an owner, places are its to refuse even where it wants no
	 * checkpoints spread over the frame) */
	if ((!s->ck_every && !s->ck_take) || s->frame == UINT32_MAX ||
	    !s->out_pos)
		return;
	if (s->place && &s->ck[s->place - 1] != keep)
		ckpt_drop(s, &s->ck[s->place - 1]);
	s->place = 0;
	c = ckpt_slot(s);
	s->placing = true;
	if (c && ckpt_save(s, c))
		s->place = (int)(c - s->ck) + 1;
	s->placing = false;
}

/* Put checkpoint c back: the stream stands where it was saved. */
static void ckpt_restore(struct zseek_stream *s, struct zseek_ckpt *c)
{
	memcpy(s->ws, c->state, s->ws_size);
	s->frame = atomic_load(&c->frame);
	s->out_pos = atomic_load(&c->pos);
	s->in_off = c->in_off;
	s->in_pos = s->in_len = 0;
	s->restores++;
}

/*
 * Produce the frame's content into dst (len bytes, or discarding when dst
 * is NULL, until the frame ends).  Returns bytes produced or -errno.
 */
static int64_t stream_pump(struct zseek_stream *s, zseek_read_fn rd,
			   void *ctx, const struct zseek_frame *fr, void *dst,
			   size_t len)
{
	uint64_t produced = 0, end = fr->c_off + fr->c_size;

	while (dst ? produced < len : true) {
		ZSTD_inBuffer in;
		ZSTD_outBuffer out;
		size_t r;

		if (s->in_pos == s->in_len) {
			size_t n = end - s->in_off < s->in_cap
					   ? (size_t)(end - s->in_off)
					   : s->in_cap;
			ssize_t got;

			if (n == 0)
				return dst ? -EBADMSG : (int64_t)produced;
			got = rd(ctx, s->inbuf, n, s->in_off);
			if (got < 0)
				return got;
			if ((size_t)got != n)
				return -EBADMSG;
			s->in_off += n;
			s->in_pos = 0;
			s->in_len = n;
		}
		in = (ZSTD_inBuffer){s->inbuf, s->in_len, s->in_pos};
		if (dst)
			out = (ZSTD_outBuffer){(char *)dst + produced,
					       len - produced, 0};
		else
			out = (ZSTD_outBuffer){s->scratch, ZSTD_BLOCKSIZE_MAX,
					       0};
		r = ZSTD_decompressStream(s->ds, &out, &in);
		if (ZSTD_isError(r))
			return zstd_err(r);
		s->in_pos = in.pos;
		s->out_pos += out.pos;
		produced += out.pos;
		if (produced > ZSEEK_MAX_CONTENT)
			return -EFBIG;
		if (r == 0) { /* the frame is complete */
			if (dst && produced < len)
				return -EBADMSG;
			if (!dst)
				return (int64_t)produced;
		}
	}
	return (int64_t)produced;
}

/*
 * The memory a stream needs to decode frame fr: its workspace (the
 * decoder and its window, or, if smaller, the content) and its buffers,
 * from the frame's header.  0, or -EBADMSG if the header cannot be read or
 * wants too large a window.
 */
int zseek_stream_need(zseek_read_fn rd, void *ctx,
		      const struct zseek_frame *fr, uint64_t *bytes)
{
	ZSTD_frameHeader fh;
	int r = frame_header(rd, ctx, fr, &fh);

	if (r)
		return r;
	*bytes = workspace_size(fh.windowSize, fh.frameContentSize) +
		 ZSTD_DStreamInSize() + ZSTD_BLOCKSIZE_MAX;
	return 0;
}

int64_t zseek_stream_count(struct zseek_stream *s, zseek_read_fn rd,
			   void *ctx, const struct zseek_frame *fr)
{
	int r = stream_reset(s, rd, ctx, fr, UINT32_MAX);

	return r ? r : stream_pump(s, rd, ctx, fr, NULL, 0);
}

/* Content [off, off + len) of frame, continuing the stream when it can. */
int zseek_stream_read(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
		      const struct zseek_index *idx, uint32_t frame,
		      uint64_t off_in_frame, void *dst, size_t len)
{
	const struct zseek_frame frame_v = zseek_frame_at(idx, frame);
	const struct zseek_frame *fr = &frame_v;
	bool behind = s->frame != frame || s->out_pos > off_in_frame;
	struct zseek_ckpt *c = ckpt_below(s, frame, off_in_frame);
	struct zseek_ckpt *place = s->place ? &s->ck[s->place - 1] : NULL;
	int64_t r;

	if (off_in_frame + len > fr->d_size)
		return -EINVAL;
	/* going back in the frame: the place it leaves is kept */
	if (s->frame == frame && s->out_pos > off_in_frame &&
	    s->out_pos < fr->d_size)
		ckpt_keep_place(s, c);
	if (c && (behind || atomic_load(&c->pos) > s->out_pos)) {
		ckpt_restore(s, c);
		/* a place kept is for the one reader that left it */
		if (c == place && s->place != (int)(c - s->ck) + 1)
			ckpt_drop(s, c);
	} else if (behind) {
		r = stream_reset(s, rd, ctx, fr, frame);
		if (r < 0)
			goto bad;
	}
	while (s->out_pos < off_in_frame) {
		uint64_t to = off_in_frame;
		size_t skip;

		/* stop at the next checkpoint's place on the way */
		if (s->ck_every && s->out_pos / s->ck_every < to / s->ck_every)
			to = (s->out_pos / s->ck_every + 1) * s->ck_every;
		skip = to - s->out_pos < ZSTD_BLOCKSIZE_MAX
			       ? (size_t)(to - s->out_pos)
			       : ZSTD_BLOCKSIZE_MAX;
		r = stream_pump(s, rd, ctx, fr, s->scratch, skip);
		if (r < 0)
			goto bad;
		s->skipped += skip;
		ckpt_take(s, fr);
	}
	r = stream_pump(s, rd, ctx, fr, dst, len);
	/* the piece that ends the frame: its checksum is read and checked
	 * too, whether or not zstd got to it filling the piece */
	if (r >= 0 && s->out_pos == fr->d_size)
		r = stream_pump(s, rd, ctx, fr, NULL, 0) ? -EBADMSG : 0;
	if (r < 0)
		goto bad;
	ckpt_take(s, fr);
	return 0;
bad:
	s->frame = UINT32_MAX; /* start over next time */
	return (int)r;
}

/*
 * Bring the stream to off_in_frame of frame and keep that place (as a
 * stream taken back keeps the place it leaves): a read that is to decode
 * past a piece another reader is filling leaves that reader its place.
 */
int zseek_stream_keep_at(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
			 const struct zseek_index *idx, uint32_t frame,
			 uint64_t off_in_frame)
{
	int r = zseek_stream_read(s, rd, ctx, idx, frame, off_in_frame,
				  s->scratch, 0);

	if (!r && (!s->place || atomic_load(&s->ck[s->place - 1].pos) !=
					 off_in_frame))
		ckpt_keep_place(s, NULL);
	return r;
}
