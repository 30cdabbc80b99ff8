// SPDX-License-Identifier: MIT
/*
 * Big frames decoded in pieces, and frames that fail.
 *
 * A frame bigger than ZSEEK_SPLIT_ABOVE (a plain `zstd FILE`, one frame
 * for the whole file) is served in ZSEEK_SUBFOLIO folios by a stream: a
 * decoder kept with its window between reads, so that a sequential reader
 * continues where its last piece ended.  A file has ZFILE_STREAMS of them;
 * their windows are charged to the budget and given back, least recently
 * used first, by the dataset's stream pool.
 *
 * A frame that fails to decode or verify is said in the log once, and
 * never served again: every read of its range is refused before the cache
 * is looked at, and what the kernel's page cache holds of the mount goes.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

/* Free z's decoder and give back its window; z's lock is held. */
static void zstream_drop(struct zstream *z)
{
	struct group *root = &z->owner->mapping->cache->budget.root;

	if (z->ready)
		zseek_stream_free(&z->s);
	z->ready = false;
	if (!z->pages)
		return;
	uncharge(root, z->pages);
	stat_mod(root, STAT_DECODER_WINDOWS, -(long)z->pages);
	z->pages = 0;
}

/* z dropped, and the choice told that it stands nowhere and has no window;
 * z's lock is held, and it is on no pool's list. */
static void zstream_forget(struct zstream *z)
{
	struct zfile *f = z->owner;

	zstream_drop(z);
	pthread_mutex_lock(&f->stream_lock);
	z->frame = UINT32_MAX;
	z->pos = z->from = 0;
	z->win = 0;
	pthread_mutex_unlock(&f->stream_lock);
}

/* An idle z, whose lock reclaim took, off the pool's list (its lock held)
 * and forgotten, and its lock given back. */
static void zstream_evict(struct zstream *z)
{
	cds_list_del_init(&z->link);
	zstream_forget(z);
	pthread_mutex_unlock(&z->lock);
}

/* f's streams off the pool and freed: f's last reference is going. */
void zfile_streams_release(struct zfile *f)
{
	/* all off the pool first: reclaim looks at a listed stream's
	 * siblings (sibling_busy) */
	pthread_mutex_lock(&f->pool->lock);
	for (int i = 0; i < ZFILE_STREAMS; i++)
		cds_list_del_init(&f->streams[i].link);
	pthread_mutex_unlock(&f->pool->lock);
	for (int i = 0; i < ZFILE_STREAMS; i++) {
		struct zstream *z = &f->streams[i];

		zstream_drop(z);
		pthread_mutex_destroy(&z->lock);
	}
	pthread_mutex_destroy(&f->stream_lock);
}

/*
 * Free the least recently used idle stream of another file: false if none.
 * Never another of mine's own file: the reader that one follows would
 * start over and take a window back in turn (zfile_read_split shares one
 * instead).
 */
static bool stream_evict_one(struct stream_pool *pool, struct zstream *mine)
{
	struct zstream *z;
	bool freed = false;

	pthread_mutex_lock(&pool->lock);
	cds_list_for_each_entry(z, &pool->lru, link)
	{
		/* trylock: a stream in use is not idle, and the lock order
		 * (stream, then pool) must not be reversed */
		if (z->owner == mine->owner || pthread_mutex_trylock(&z->lock))
			continue;
		zstream_evict(z);
		freed = true;
		break;
	}
	pthread_mutex_unlock(&pool->lock);
	return freed;
}

/* Whether another decoder of z's file is in use (its lock held); the
 * pool's lock is held. */
static bool sibling_busy(const struct zstream *z)
{
	struct zfile *f = z->owner;

	for (int i = 0; i < ZFILE_STREAMS; i++) {
		struct zstream *o = &f->streams[i];

		if (o == z)
			continue;
		if (pthread_mutex_trylock(&o->lock))
			return true;
		pthread_mutex_unlock(&o->lock);
	}
	return false;
}

/*
 * Reclaim's last resort (the cache's shrink_other, as the kernel's
 * shrink_slab): idle decoders, least recently used first, give back their
 * windows and checkpoints until nr pages are freed.  Only reclaim the user
 * asked for (a lower memory.max, memory.reclaim) comes here, and only for
 * what the folios and the compressed cache could not give, so a mount can
 * be brought down to its metadata; a charge that needs room takes idle
 * windows of other files itself (stream_charge).  A reader
 * of a decoder dropped starts over from its frame's start or its nearest
 * piece.  Never a decoder in use: its reader holds its lock, and may be
 * the one reclaiming; nor one of a file being read, whose reader falls
 * back on it when the budget has no room for a window of its own
 * (zfile_read_split).
 */
unsigned long stream_pool_shrink(void *arg, unsigned long nr)
{
	struct stream_pool *pool = arg;
	struct zstream *z, *tmp;
	unsigned long freed = 0;

	pthread_mutex_lock(&pool->lock);
	cds_list_for_each_entry_safe(z, tmp, &pool->lru, link)
	{
		if (freed >= nr)
			break;
		if (pthread_mutex_trylock(&z->lock))
			continue;
		if (sibling_busy(z)) {
			pthread_mutex_unlock(&z->lock);
			continue;
		}
		freed += z->pages + z->ck_pages;
		stat_inc(&z->owner->mapping->cache->budget.root,
			 STAT_DECODERS_RECLAIMED);
		zstream_evict(z);
	}
	pthread_mutex_unlock(&pool->lock);
	return freed;
}

/*
 * Checkpoints of stream decoders, all the mount's together, take at most
 * an eighth of the budget (windows a quarter): each is a window's worth,
 * and what it saves is decoding, which the pieces in the cache save too.
 */
#define CKPT_SHARE_SHIFT 3

static bool ckpt_take(void *arg, size_t bytes)
{
	struct zstream *z = arg;
	struct group *root = &z->owner->mapping->cache->budget.root;
	unsigned long pages = pages_of_bytes(bytes);
	unsigned long share = (unsigned long)counter_max(&root->mem) >>
			      CKPT_SHARE_SHIFT;

	/* a place kept for a reader may take one state more: the others
	 * are spread to fill the share (ckpt_every) */
	if (pages > share ||
	    (unsigned long)stat_read(root, STAT_DECODER_CKPTS) + pages >
		share + (z->s.placing ? pages : 0))
		return false;
	/* folios go for it, one pass's worth: not a demand's retries and
	 * grace periods (the stream's lock is held), nor its events */
	if (charge_nowait(root, pages) &&
	    (reclaim_pass(root, pages, false), charge_nowait(root, pages)))
		return false;
	stat_mod(root, STAT_DECODER_CKPTS, (long)pages);
	z->ck_pages += pages;
	return true;
}

static void ckpt_give(void *arg, size_t bytes)
{
	struct zstream *z = arg;
	struct group *root = &z->owner->mapping->cache->budget.root;
	unsigned long pages = pages_of_bytes(bytes);

	uncharge(root, pages);
	stat_mod(root, STAT_DECODER_CKPTS, -(long)pages);
	z->ck_pages -= pages;
}

/*
 * Frame fr's pieces and one decoder of state bytes fit in the budget, with
 * the checkpoints' share to spare, beside what other files' folios hold
 * now (the page cache's pages give way to pieces): once read, every piece
 * can stay cached, and checkpoints or a second decoder would only take the
 * room of pieces (a 102 MiB SQLite database in one frame, integrity_check
 * at budget=128M: 18 MiB of checkpoints and 11 MiB of windows left the
 * last pieces no room, and each came back decoded from a checkpoint, 3,792
 * pieces decoded in 20 s for a file of 103).
 */
static bool frame_fits(struct zfile *f, const struct zseek_frame *fr,
		       uint64_t state)
{
	struct mapping *m = f->mapping;
	struct group *root = &m->cache->budget.root;
	uint64_t budget = (uint64_t)counter_max(&root->mem) << ZF_PAGE_SHIFT;
	long mine = atomic_load_explicit(&m->nr_cached, memory_order_relaxed) *
		    (long)mapping_folio_pages(m, 0);
	long others = stat_read(root, STAT_FILE) - mine;
	uint64_t held = others > 0 ? (uint64_t)others << ZF_PAGE_SHIFT : 0;

	return fr->d_size + state + held <= budget - (budget >> CKPT_SHARE_SHIFT);
}

/*
 * Where a stream saves its state in frame fr, each save costing state
 * bytes: as many checkpoints as the budget's eighth holds (at most
 * ZSEEK_CKPTS), spread evenly over the frame, no closer than two states'
 * worth of content (decoding that much costs about what a read back from
 * the last one saves); 0, none, when not one fits.
 */
static uint64_t ckpt_every(struct zfile *f, const struct zseek_frame *fr,
			   uint64_t state)
{
	struct group *root = &f->mapping->cache->budget.root;
	uint64_t room = ((uint64_t)counter_max(&root->mem) << ZF_PAGE_SHIFT) >>
			CKPT_SHARE_SHIFT;
	uint64_t n = state ? room / state : 0, every;

	if (n > ZSEEK_CKPTS)
		n = ZSEEK_CKPTS;
	if (!n || frame_fits(f, fr, state))
		return 0;
	every = fr->d_size / (n + 1);
	if (every < 2 * state)
		every = 2 * state;
	return (every + ZSEEK_SUBFOLIO - 1) / ZSEEK_SUBFOLIO * ZSEEK_SUBFOLIO;
}

/*
 * Charge the stream's window to the budget before it is allocated: up to
 * 128 MiB for frames the zstd CLI wrote with --long or --ultra.  Idle
 * streams of other files give their windows back when windows would take
 * more than a quarter of the budget, or when there is no room; -ENOSPC if
 * the budget still cannot hold it.  z's lock is held.  (A window stays
 * with its stream after the read: 40 files of 6 MiB read in turn at
 * budget=64M left 62.6 MiB of idle windows, and the files' pieces 1 MiB.)
 */
static int stream_charge(struct zstream *z, const struct zseek_frame *fr)
{
	struct zfile *f = z->owner;
	struct group *root = &f->mapping->cache->budget.root;
	unsigned long pages;

	/* from the frame's header, read once per frame, not once a piece */
	if (z->need_off != fr->c_off) {
		int r = zseek_stream_need(zfile_read_cb, f, fr, &z->need);

		if (r)
			return r;
		z->need_off = fr->c_off;
	}
	pages = pages_of_bytes(z->need);
	/* windows, idle ones of files read before included, never take more
	 * than a quarter of the budget while one can be given back: the
	 * pieces they decode need the room */
	while (pages > z->pages &&
	       (unsigned long)stat_read(root, STAT_DECODER_WINDOWS) + pages -
		       z->pages >
		   (unsigned long)counter_max(&root->mem) / 4 &&
	       stream_evict_one(f->pool, z))
		;
	while (pages > z->pages && charge_demand(root, pages - z->pages)) {
		if (stream_evict_one(f->pool, z))
			continue;
		return -ENOSPC;
	}
	if (pages > z->pages) {
		stat_mod(root, STAT_DECODER_WINDOWS, (long)(pages - z->pages));
		z->pages = pages;
	}
	/* the most recently used goes last */
	pthread_mutex_lock(&f->pool->lock);
	cds_list_del(&z->link);
	cds_list_add_tail(&z->link, &f->pool->lru);
	pthread_mutex_unlock(&f->pool->lock);
	return 0;
}

/*
 * The stream to read [at, ...) of frame with: the one with least to decode
 * to get there (from where it stands, or from the frame's start if it is
 * past that point or elsewhere); of equals, the least recently chosen.  A
 * stream another reader is using still counts: its read takes it forwards,
 * and the next piece of a sequential reader is right behind the last.  A
 * stream without a window is taken only while all the mount's windows
 * stay within an eighth of the budget: at a small budget a second window
 * would take the room of the pieces both readers need, and a piece
 * evicted before its reader is done with it starts the frame over; and
 * never for a frame that fits (frame_fits), whose pieces all stay.
 */
static struct zstream *stream_choose(struct zfile *f, uint32_t frame,
				     uint64_t at)
{
	struct group *root = &f->mapping->cache->budget.root;
	const struct zseek_frame frame_v = zseek_frame_at(&f->idx, frame);
	struct zstream *best = NULL;
	uint64_t best_cost = 0;
	unsigned long most = 0;
	bool room;

	pthread_mutex_lock(&f->stream_lock);
	for (int i = 0; i < ZFILE_STREAMS; i++)
		if (f->streams[i].win > most)
			most = f->streams[i].win;
	room = (unsigned long)stat_read(root, STAT_DECODER_WINDOWS) + most <=
	       (unsigned long)counter_max(&root->mem) / 8;
	/* a frame that fits keeps to the decoder already in it */
	for (int i = 0; room && i < ZFILE_STREAMS; i++)
		if (f->streams[i].win && f->streams[i].frame == frame) {
			room = !frame_fits(f, &frame_v,
					   (uint64_t)most << ZF_PAGE_SHIFT);
			break;
		}
	for (int i = 0; i < ZFILE_STREAMS; i++) {
		struct zstream *z = &f->streams[i];
		uint64_t cost =
		    z->frame == frame && z->pos <= at ? at - z->pos : at;
		uint64_t ck = zseek_stream_ckpt_below(&z->s, frame, at);

		if (at - ck < cost)
			cost = at - ck;
		/* a reader taking it forwards past at, which another is
		 * filling, leaves a place there (split_pass_over) */
		if (z->frame == frame && z->from <= at && at < z->pos &&
		    at - z->from < cost)
			cost = at - z->from;

		if (!z->win && most && !room)
			continue;
		if (!best || cost < best_cost ||
		    (cost == best_cost && z->used < best->used)) {
			best = z;
			best_cost = cost;
		}
	}
	best->used = ++f->stream_clock;
	/* it is on its way there, with a window: the next reader counts
	 * from there */
	best->from = best->frame == frame && best->pos <= at ? best->pos : at;
	best->frame = frame;
	best->pos = at;
	if (!best->win)
		best->win = most ? most : 1;
	pthread_mutex_unlock(&f->stream_lock);
	return best;
}

/*
 * The pieces of slot's frame that stream z must decode to reach slot:
 * those from where it stands (or its nearest checkpoint, or the frame's
 * start, if it must go back), kept in the cache for g as they pass where the budget has room,
 * instead of decoded into scratch and dropped.  A random reader of a big
 * frame (a plain `zstd` file) then pays for the frame's start once, not at
 * every read.  z's lock is held.
 */
static void split_pass_over(struct zfile *f, struct zstream *z,
			    unsigned long slot, struct group *g)
{
	uint32_t frame = f->slot_frame[slot];
	uint64_t from = 0;
	unsigned long j = slot;
	bool kept = false;

	if (!g)
		return;
	uint64_t ck = zseek_stream_ckpt_below(&z->s, frame, f->slot_skip[slot]);

	if (z->s.frame == frame && z->s.out_pos <= f->slot_skip[slot])
		from = z->s.out_pos;
	if (ck > from) /* the read goes back there */
		from = ck;
	while (j > 0 && f->slot_frame[j - 1] == frame &&
	       f->slot_skip[j - 1] >= from)
		j--;
	for (; j < slot; j++) {
		struct folio *p;
		int r;

		p = cache_pass_over_begin(f->mapping, j, g);
		/* another reader is filling this piece: it gets the place
		 * kept, not a restart from a checkpoint behind (two windows
		 * of one sequential reader, filled by two workers) */
		if (!p && !kept && mapping_in_flight(f->mapping, j)) {
			kept = true;
			if (zseek_stream_keep_at(&z->s, zfile_read_cb, f,
						 &f->idx, frame,
						 f->slot_skip[j]))
				return;
			continue;
		}
		if (!p)
			continue; /* cached, or no room: decoded in passing */
		folio_set(p, FOLIO_PIECE);
		r = zseek_stream_read(&z->s, zfile_read_cb, f, &f->idx, frame,
				      f->slot_skip[j], p->data, p->len);
		cache_pass_over_end(p, r);
		if (r)
			return; /* the read asked for starts over, and says */
	}
}

/*
 * f's backing file is not what was indexed: rewritten in place since (or
 * only touched).  Asked where a frame did not decode, so that a file
 * changed under an open handle is not taken for a damaged one.  Objects in
 * a store have their own check (store_obj_changed).
 */
static bool backing_changed(struct zfile *f)
{
	struct stat st;

	return !f->obj && backing_lstat(f->ds, f->path, &st) == 0 &&
	       !same_backing(&st, &f->st);
}

/* The longest a read that finds a frame damaged waits for the page cache
 * to let go of the mount's pages (a few MiB take microseconds, but the
 * whole tier may be queued) */
#define FAILED_DRAIN_US 100000

/*
 * A frame decoded in pieces (over ZSEEK_SPLIT_ABOVE: a plain `zstd FILE`)
 * is checked only when its decoder reaches the frame's end, so its pieces
 * before were served unchecked.  Once it fails there (or anywhere), none
 * of it is served again: every read of its range fails (zfile_range_refused,
 * before the cache is looked at), and what the kernel's page cache holds
 * of the mount is dropped, as for a lying table.  Without memory for the
 * bits, the whole file fails.
 */
static void frame_failed(struct zfile *f, uint32_t frame)
{
	_Atomic uint8_t *bits = atomic_load(&f->failed), *none = NULL;

	if (!bits) {
		bits = calloc(f->idx.nframes / 8 + 1, 1);
		if (!bits) {
			atomic_store(&f->table_lies, true);
			ktier_evict_all(f->mapping->cache);
			return;
		}
		if (!atomic_compare_exchange_strong(&f->failed, &none, bits)) {
			free((void *)bits);
			bits = none;
		}
	}
	atomic_fetch_or(&bits[frame / 8], (uint8_t)(1u << (frame % 8)));
	ktier_evict_all(f->mapping->cache);
	/* gone before this read's reader hears of it, and reads again */
	ktier_drain(f->mapping->cache, FAILED_DRAIN_US);
}

/*
 * A read that zfile_range_refused() refuses: what the kernel's page cache
 * holds of the mount goes before its reader hears of it, as when the frame
 * failed.  The read that found the frame failing may still be dropping it
 * (frame_failed() marks the frame first), and this one, refused at once,
 * would otherwise let its reader's next call find those pages.
 */
void zfile_refused(struct zfile *f)
{
	ktier_evict_all(f->mapping->cache);
	ktier_drain(f->mapping->cache, FAILED_DRAIN_US);
}

bool zfile_has_failed(struct zfile *f)
{
	return atomic_load(&f->table_lies) || atomic_load(&f->failed);
}

bool zfile_range_refused(struct zfile *f, uint64_t pos, uint64_t len)
{
	_Atomic uint8_t *bits = atomic_load(&f->failed);
	unsigned long i, last;

	if (atomic_load(&f->table_lies))
		return true;
	if (!bits || !len || !f->nslots)
		return false;
	last = mapping_index(f->mapping, pos + len - 1);
	for (i = mapping_index(f->mapping, pos); i <= last && i < f->nslots;
	     i++) {
		uint32_t fr = zfile_slot_frame(f, i);

		if (atomic_load_explicit(&bits[fr / 8], memory_order_relaxed) &
		    (1u << (fr % 8)))
			return true;
	}
	return false;
}

/* Content of slot (a piece of a big frame) into dst, for g's fill (or
 * NULL: a bounce read, which keeps nothing). */
int zfile_read_split(struct zfile *f, unsigned long slot, void *dst, size_t len,
		     struct group *g)
{
	uint32_t frame = f->slot_frame[slot];
	const struct zseek_frame frame_v = zseek_frame_at(&f->idx, frame);
	const struct zseek_frame *fr = &frame_v;
	struct zstream *z = stream_choose(f, frame, f->slot_skip[slot]);
	int r;

	pthread_mutex_lock(&z->lock);
	r = stream_charge(z, fr);
	/*
	 * No room for another window: share one this file has (busy, or it
	 * would have been freed), waiting for its reader.  With none, the
	 * budget cannot hold a decoder for this frame: EIO, said in the log.
	 */
	for (int i = 0; r == -ENOSPC && i < ZFILE_STREAMS; i++) {
		struct zstream *o = &f->streams[i];

		if (o == z)
			continue;
		pthread_mutex_lock(&f->stream_lock);
		z->frame = UINT32_MAX; /* not moved: it has no decoder */
		z->win = z->pages;
		pthread_mutex_unlock(&f->stream_lock);
		pthread_mutex_unlock(&z->lock);
		pthread_mutex_lock(&o->lock);
		z = o;
		r = o->pages ? stream_charge(o, fr) : -ENOSPC;
	}
	if (r == -ENOSPC) {
		uint64_t need = 0;

		zseek_stream_need(zfile_read_cb, f, fr, &need);
		zlog_file(f->path,
			  "the budget cannot hold a %llu MiB decoder "
			  "window for a frame at offset %llu (a "
			  "bigger budget= reads it)",
			  (unsigned long long)(need >> 20),
			  (unsigned long long)fr->c_off);
		stat_inc(g ? g : &f->mapping->cache->budget.root,
			 STAT_WINDOWS_REFUSED);
		r = -EIO;
	}
	if (!r && !z->ready) {
		r = zseek_stream_init(&z->s);
		z->ready = r == 0;
		z->s.ck_take = ckpt_take;
		z->s.ck_give = ckpt_give;
		z->s.ck_arg = z;
	}
	if (!r) {
		struct group *root = &f->mapping->cache->budget.root;
		uint64_t skipped = z->s.skipped, restores = z->s.restores;
		bool behind = f->slot_skip[slot] &&
			      (z->s.frame != frame ||
			       z->s.out_pos > f->slot_skip[slot]);

		z->s.ck_every = ckpt_every(f, fr, z->need);
		split_pass_over(f, z, slot, g);
		r = zseek_stream_read(&z->s, zfile_read_cb, f, &f->idx, frame,
				      f->slot_skip[slot], dst, len);
		stat_mod(root, STAT_DECODER_SKIPPED,
			 (long)(z->s.skipped - skipped));
		if (z->s.restores != restores)
			stat_mod(root, STAT_DECODER_CKPT_RESTORES,
				 (long)(z->s.restores - restores));
		else if (behind)
			stat_inc(root, STAT_DECODER_RESTARTS);
	}
	/* where it stands now (the choice never holds a stream's lock) */
	pthread_mutex_lock(&f->stream_lock);
	z->frame = z->ready ? z->s.frame : UINT32_MAX;
	z->pos = z->ready ? z->s.out_pos : 0;
	z->from = z->pos;
	z->win = z->pages;
	pthread_mutex_unlock(&f->stream_lock);
	pthread_mutex_unlock(&z->lock);
	if ((r == -EBADMSG || r == -ENOKEY) && !backing_changed(f))
		frame_failed(f, frame);
	return r;
}

/*
 * A frame that does not decode is said in the log, once per frame (with
 * the file's name), besides being counted in corrupt_frames: a reader gets
 * EIO, and whoever looks must learn which file and where.
 */
int zfile_said_if_corrupt(struct zfile *f, unsigned long slot, int r)
{
	unsigned long long off;

	if (r != -EUCLEAN && r != -ENOKEY && r != -EBADMSG)
		return r;
	/* not damaged: rewritten in place since it was indexed (a new open
	 * indexes it again); EIO, not counted as a corrupt frame */
	if (backing_changed(f)) {
		bool said = atomic_exchange(&f->said_changed, true);

		if (!said && f->ds->mf) /* a packed dataset's data file */
			manifest_say_changed(f->ds, f->path);
		else if (!said)
			zlog_file(f->path,
				  "changed on disk while open: reads through "
				  "handles opened before fail, a new open "
				  "reads the new content");
		return -EIO;
	}
	off = zseek_frame_at(&f->idx, zfile_slot_frame(f, slot)).c_off;
	if (r == -EUCLEAN) {
		atomic_store(&f->table_lies, true);
		/* pages filled from the wrong place may be in the page cache,
		 * which a read of a file the kernel opened itself reaches
		 * without asking (kernel_opens): none stays */
		ktier_evict_all(f->mapping->cache);
		zlog_file(f->path,
			  "the seek table gives the frame at offset %llu a "
			  "size its header does not: the table is damaged, "
			  "and the whole file reads as EIO",
			  off);
	} else if (r == -ENOKEY) {
		zlog_file(f->path,
			  "the frame at offset %llu was compressed with a "
			  "zstd dictionary that was not given (-o dict=FILE)",
			  off);
	} else {
		zlog_file(f->path, "the frame at offset %llu does not decode%s",
			  off,
			  f->idx.has_checksum || f->idx.frames_checked
			      ? ", or fails its checksum"
			      : "");
	}
	return -EBADMSG;
}
