/* An intrusive circular doubly linked queue, after libuv's src/queue.h.
 *
 * Intrusive: the element embeds the links (an nh_queue_t field) instead of a list
 * holding pointers to elements, so linking never allocates (and cannot fail), an
 * element knows its own place and leaves from the middle in O(1) without a walk, and
 * one element can sit on several queues through several fields. nh_queue_data() gets
 * the element back from its field.
 *
 * Circular, with a sentinel: the queue itself is an nh_queue_t whose next is the head
 * and prev the tail; an empty queue points at itself. No NULL checks, no special case
 * for the first or last element.
 *
 *   typedef struct job { int id; nh_queue_t node; } job_t;
 *   nh_queue_t jobs;
 *   nh_queue_init(&jobs);
 *   nh_queue_insert_tail(&jobs, &j->node);             FIFO: append at the tail
 *   while (!nh_queue_empty(&jobs)) {                   pop from the head
 *     job_t *j = nh_queue_data(nh_queue_head(&jobs), job_t, node);
 *     nh_queue_remove(&j->node);
 *     ...
 *   }
 *   nh_queue_t *q, *n;
 *   nh_queue_foreach_safe(q, n, &jobs) {               q may be removed (and freed)
 *     job_t *j = nh_queue_data(q, job_t, node);
 *     if (j->id == 3) { nh_queue_remove(q); free(j); }
 *   }
 *
 * Every node is alike, so the insertions also work relative to an element:
 * nh_queue_insert_head(&elem->node, q) puts q right after elem, nh_queue_insert_tail
 * right before it (an ordered insert).
 *
 * The safe loop tolerates removing the current element only (a removed next one
 * points at itself: the loop would spin on it). When a callback run from the loop may
 * unlink other elements too (a close cascade), drain instead: pop the head until
 * empty, or nh_queue_move() everything to a local queue first.
 *
 * nh_queue_remove() leaves the node pointing at itself, so a removed node (and one
 * that was only nh_queue_init'ed) reads as unlinked: nh_queue_empty(&elem->node), and
 * removing it again is harmless. Header-only, no dependencies. */
#ifndef NH_QUEUE_H
#define NH_QUEUE_H

#include <stddef.h>

typedef struct nh_queue {
  struct nh_queue *next;
  struct nh_queue *prev;
} nh_queue_t;

/* A static queue's initializer: static nh_queue_t q = NH_QUEUE_INITIALIZER(q); */
#define NH_QUEUE_INITIALIZER(h) { &(h), &(h) }

/* The element of type `type` whose member `field` is at ptr (container-of). */
#define nh_queue_data(ptr, type, field) ((type *)((char *)(ptr) - offsetof(type, field)))

/* Iterates q over h's elements, head to tail. Do not unlink q in the body. */
#define nh_queue_foreach(q, h) for ((q) = (h)->next; (q) != (h); (q) = (q)->next)

/* Same, but q may be removed (or freed) in the body: n holds the next one. */
#define nh_queue_foreach_safe(q, n, h)                                                             \
  for ((q) = (h)->next, (n) = (q)->next; (q) != (h); (q) = (n), (n) = (q)->next)

/* Makes h an empty queue, or a node an unlinked one. */
static inline void nh_queue_init(nh_queue_t *h)
{
  h->next = h;
  h->prev = h;
}

/* True when the queue h is empty, or when the node h is not on any queue. */
static inline int nh_queue_empty(const nh_queue_t *h) { return h->next == h; }

/* The first / last element's node; h itself when the queue is empty. */
static inline nh_queue_t *nh_queue_head(const nh_queue_t *h) { return h->next; }
static inline nh_queue_t *nh_queue_tail(const nh_queue_t *h) { return h->prev; }

/* The node after / before q; the queue's own head node at the end. */
static inline nh_queue_t *nh_queue_next(const nh_queue_t *q) { return q->next; }
static inline nh_queue_t *nh_queue_prev(const nh_queue_t *q) { return q->prev; }

/* Appends q (unlinked) at the tail of h. */
static inline void nh_queue_insert_tail(nh_queue_t *h, nh_queue_t *q)
{
  q->next = h;
  q->prev = h->prev;
  h->prev->next = q;
  h->prev = q;
}

/* Prepends q (unlinked) at the head of h. */
static inline void nh_queue_insert_head(nh_queue_t *h, nh_queue_t *q)
{
  q->next = h->next;
  q->prev = h;
  h->next->prev = q;
  h->next = q;
}

/* Unlinks q from whatever queue it is on, and leaves it unlinked (self-pointing) so a
 * second remove, or an nh_queue_empty(q) check, is safe. */
static inline void nh_queue_remove(nh_queue_t *q)
{
  q->prev->next = q->next;
  q->next->prev = q->prev;
  q->next = q;
  q->prev = q;
}

/* Moves all of h's elements, in order, to n (whose old contents are dropped); h ends
 * empty. For walking a queue whose elements' callbacks may unlink one another. */
static inline void nh_queue_move(nh_queue_t *h, nh_queue_t *n)
{
  if (nh_queue_empty(h)) {
    nh_queue_init(n);
    return;
  }
  n->next = h->next;
  n->prev = h->prev;
  n->next->prev = n;
  n->prev->next = n;
  nh_queue_init(h);
}

#endif
