/* `tandem mkmodel` tokenizer keys. Either copied from another GGUF (the tiny preset copies the
 * tests/data model's tokenizer), or synthesized: a valid byte-level BPE vocabulary of the real size
 * with the 256 GPT-2 byte symbols, merges that build a few hundred common English words (with and
 * without a leading space) left to right, the architecture's special tokens at their real ids
 * (GLM-5: <|endoftext|> 154820 ... ; DeepSeek-V3: BOS 0, EOS 1, <｜User｜> 128803 ...) and
 * "[PAD<id>]" for every unused id, with the token types llama.cpp's converter writes (1 normal,
 * 3 control, 5 unused). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/mkmodel.h"

static const char *const words[] = {
    "the",      "be",       "to",       "of",       "and",      "in",      "that",     "have",
    "it",       "for",      "not",      "on",       "with",     "he",      "as",       "you",
    "do",       "at",       "this",     "but",      "his",      "by",      "from",     "they",
    "we",       "say",      "her",      "she",      "or",       "an",      "will",     "my",
    "one",      "all",      "would",    "there",    "their",    "what",    "so",       "up",
    "out",      "if",       "about",    "who",      "get",      "which",   "go",       "me",
    "when",     "make",     "can",      "like",     "time",     "no",      "just",     "him",
    "know",     "take",     "people",   "into",     "year",     "your",    "good",     "some",
    "could",    "them",     "see",      "other",    "than",     "then",    "now",      "look",
    "only",     "come",     "its",      "over",     "think",    "also",    "back",     "after",
    "use",      "two",      "how",      "our",      "work",     "first",   "well",     "way",
    "even",     "new",      "want",     "because",  "any",      "these",   "give",     "day",
    "most",     "us",       "is",       "are",      "was",      "were",    "been",     "has",
    "had",      "did",      "said",     "made",     "find",     "here",    "thing",    "many",
    "where",    "very",     "through",  "long",     "down",     "should",  "each",     "much",
    "before",   "right",    "too",      "mean",     "old",      "same",    "tell",     "does",
    "set",      "three",    "want",     "air",      "play",     "small",   "end",      "put",
    "home",     "read",     "hand",     "port",     "large",    "spell",   "add",      "land",
    "must",     "big",      "high",     "such",     "follow",   "act",     "why",      "ask",
    "men",      "change",   "went",     "light",    "kind",     "off",     "need",     "house",
    "picture",  "try",      "again",    "animal",   "point",    "mother",  "world",    "near",
    "build",    "self",     "earth",    "father",   "head",     "stand",   "own",      "page",
    "country",  "found",    "answer",   "school",   "grow",     "study",   "still",    "learn",
    "plant",    "cover",    "food",     "sun",      "four",     "between", "state",    "keep",
    "eye",      "never",    "last",     "let",      "thought",  "city",    "tree",     "cross",
    "farm",     "hard",     "start",    "might",    "story",    "saw",     "far",      "sea",
    "draw",     "left",     "late",     "run",      "while",    "press",   "close",    "night",
    "real",     "life",     "few",      "north",    "open",     "seem",    "together", "next",
    "white",    "children", "begin",    "got",      "walk",     "example", "ease",     "paper",
    "group",    "always",   "music",    "those",    "both",     "mark",    "often",    "letter",
    "until",    "mile",     "river",    "car",      "feet",     "care",    "second",   "book",
    "carry",    "took",     "science",  "eat",      "room",     "friend",  "began",    "idea",
    "fish",     "mountain", "stop",     "once",     "base",     "hear",    "horse",    "cut",
    "sure",     "watch",    "color",    "face",     "wood",     "main",    "enough",   "plain",
    "girl",     "usual",    "young",    "ready",    "above",    "ever",    "red",      "list",
    "though",   "feel",     "talk",     "bird",     "soon",     "body",    "dog",      "family",
    "direct",   "pose",     "leave",    "song",     "measure",  "door",    "product",  "black",
    "short",    "numeral",  "class",    "wind",     "question", "happen",  "complete", "ship",
    "area",     "half",     "rock",     "order",    "fire",     "south",   "problem",  "piece",
    "told",     "knew",     "pass",     "since",    "top",      "whole",   "king",     "space",
    "heard",    "best",     "hour",     "better",   "true",     "during",  "hundred",  "five",
    "remember", "step",     "early",    "hold",     "west",     "ground",  "interest", "reach",
    "fast",     "verb",     "sing",     "listen",   "six",      "table",   "travel",   "less",
    "morning",  "ten",      "simple",   "several",  "vowel",    "toward",  "war",      "lay",
    "against",  "pattern",  "slow",     "center",   "love",     "person",  "money",    "serve",
    "appear",   "road",     "map",      "rain",     "rule",     "govern",  "pull",     "cold",
    "notice",   "voice",    "unit",     "power",    "town",     "fine",    "certain",  "fly",
    "fall",     "lead",     "cry",      "dark",     "machine",  "note",    "wait",     "plan",
    "figure",   "star",     "box",      "noun",     "field",    "rest",    "correct",  "able",
    "pound",    "done",     "beauty",   "drive",    "stood",    "contain", "front",    "teach",
    "week",     "final",    "gave",     "green",    "quick",    "develop", "ocean",    "warm",
    "free",     "minute",   "strong",   "special",  "mind",     "behind",  "clear",    "tail",
    "produce",  "fact",     "street",   "inch",     "multiply", "nothing", "course",   "stay",
    "wheel",    "full",     "force",    "blue",     "object",   "decide",  "surface",  "deep",
    "moon",     "island",   "foot",     "system",   "busy",     "test",    "record",   "boat",
    "common",   "gold",     "possible", "plane",    "stead",    "dry",     "wonder",   "laugh",
    "thousand", "ago",      "ran",      "check",    "game",     "shape",   "equate",   "hot",
    "miss",     "brought",  "heat",     "snow",     "tire",     "bring",   "yes",      "distant",
    "fill",     "east",     "paint",    "language", "among",    "return",  "function", "value",
    "model",    "token",    "data",     "int",      "char",     "void",    "include",  "struct",
    "const",    "static",   "import",   "def",      "class",    "self",    "print",
};

/* GPT-2 byte-to-unicode table: printable bytes map to themselves, the rest to U+0100 + n. */
static void byte_symbols(char sym[256][4])
{
	int n = 0;
	for (int b = 0; b < 256; b++) {
		bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
		unsigned cp = printable ? (unsigned)b : 256u + (unsigned)n++;
		if (cp < 0x80) {
			sym[b][0] = (char)cp;
			sym[b][1] = 0;
		} else {
			sym[b][0] = (char)(0xc0 | (cp >> 6));
			sym[b][1] = (char)(0x80 | (cp & 0x3f));
			sym[b][2] = 0;
		}
	}
}

/* GPT-2 vocab order of the byte symbols: the printable bytes in byte order, then the others. */
static void byte_order(int order[256])
{
	int k = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int b = 0; b < 256; b++) {
			bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
			if (printable == (pass == 0))
				order[k++] = b;
		}
}

struct special {
	int64_t id;
	const char *text;
};

static const struct special glm_specials[] = {
    {154820, "<|endoftext|>"},
    {154821, "[MASK]"},
    {154822, "[gMASK]"},
    {154823, "[sMASK]"},
    {154824, "<sop>"},
    {154825, "<eop>"},
    {154826, "<|system|>"},
    {154827, "<|user|>"},
    {154828, "<|assistant|>"},
    {154829, "<|observation|>"},
    {154830, "<|begin_of_image|>"},
    {154831, "<|end_of_image|>"},
    {154832, "<|begin_of_video|>"},
    {154833, "<|end_of_video|>"},
    {154834, "<|begin_of_audio|>"},
    {154835, "<|end_of_audio|>"},
    {154836, "<|begin_of_transcription|>"},
    {154837, "<|end_of_transcription|>"},
    {154838, "<|code_prefix|>"},
    {154839, "<|code_middle|>"},
    {154840, "<|code_suffix|>"},
    {154841, "<think>"},
    {154842, "</think>"},
    {154843, "<tool_call>"},
    {154844, "</tool_call>"},
    {154845, "<tool_response>"},
    {154846, "</tool_response>"},
    {154847, "<arg_key>"},
    {154848, "</arg_key>"},
    {154849, "<arg_value>"},
    {154850, "</arg_value>"},
};

/* DeepSeek-V3 ids from its tokenizer (tests/data/tokenizer/deepseek-v3-vocab.gguf); 128000..128799
 * are "<｜place▁holder▁no▁N｜>" control tokens, added separately. */
static const struct special ds_specials[] = {
    {0, "<\xef\xbd\x9c"
        "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"},
    {1, "<\xef\xbd\x9c"
        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"},
    {2, "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>"},
    {128800, "<\xef\xbd\x9c"
             "fim\xe2\x96\x81hole\xef\xbd\x9c>"},
    {128801, "<\xef\xbd\x9c"
             "fim\xe2\x96\x81"
             "begin\xef\xbd\x9c>"},
    {128802, "<\xef\xbd\x9c"
             "fim\xe2\x96\x81"
             "end\xef\xbd\x9c>"},
    {128803, "<\xef\xbd\x9cUser\xef\xbd\x9c>"},
    {128804, "<\xef\xbd\x9c"
             "Assistant\xef\xbd\x9c>"},
    {128805, "<|EOT|>"},
    {128806, "<\xef\xbd\x9ctool\xe2\x96\x81"
             "calls\xe2\x96\x81"
             "begin\xef\xbd\x9c>"},
    {128807, "<\xef\xbd\x9ctool\xe2\x96\x81"
             "calls\xe2\x96\x81"
             "end\xef\xbd\x9c>"},
    {128808, "<\xef\xbd\x9ctool\xe2\x96\x81"
             "call\xe2\x96\x81"
             "begin\xef\xbd\x9c>"},
    {128809, "<\xef\xbd\x9ctool\xe2\x96\x81"
             "call\xe2\x96\x81"
             "end\xef\xbd\x9c>"},
    {128810, "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"
             "begin\xef\xbd\x9c>"},
    {128811, "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"
             "end\xef\xbd\x9c>"},
    {128812, "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
             "begin\xef\xbd\x9c>"},
    {128813, "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
             "end\xef\xbd\x9c>"},
    {128814, "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"},
};

#define GLM_TEMPLATE                                                                                         \
	"[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"               \
	"{% if add_generation_prompt %}<|assistant|><think>{% endif %}"
#define DS_TEMPLATE                                                                                          \
	"{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"             \
	"{% elif m['role'] == 'user' %}<\xef\xbd\x9cUser\xef\xbd\x9c>{{ m['content'] }}"                     \
	"{% elif m['role'] == 'assistant' %}<\xef\xbd\x9c"                                                   \
	"Assistant\xef\xbd\x9c>{{ m['content'] }}"                                                           \
	"<\xef\xbd\x9c"                                                                                      \
	"end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>{% endif %}{% endfor %}"                          \
	"{% if add_generation_prompt %}<\xef\xbd\x9c"                                                        \
	"Assistant\xef\xbd\x9c>{% endif %}"

/* Small string set (open addressing) for deduplicating merge results. */
struct sset {
	char **slot;
	size_t cap;
};

static uint64_t fnv(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

/* Returns 1 if inserted, 0 if present. */
static int sset_add(struct sset *S, char *s)
{
	size_t i = fnv(s) & (S->cap - 1);
	for (; S->slot[i]; i = (i + 1) & (S->cap - 1))
		if (strcmp(S->slot[i], s) == 0)
			return 0;
	S->slot[i] = s;
	return 1;
}

/* Merge string -> rank. */
struct mtab {
	const char **key;
	int64_t *rank;
	size_t cap;
};

static int64_t mtab_find(const struct mtab *M, const char *key)
{
	for (size_t i = fnv(key) & (M->cap - 1); M->key[i]; i = (i + 1) & (M->cap - 1))
		if (strcmp(M->key[i], key) == 0)
			return M->rank[i];
	return -1;
}

static void mtab_add(struct mtab *M, const char *key, int64_t rank)
{
	size_t i = fnv(key) & (M->cap - 1);
	while (M->key[i])
		i = (i + 1) & (M->cap - 1);
	M->key[i] = key;
	M->rank[i] = rank;
}

static char *join(const char *a, const char *b, const char *sep)
{
	size_t la = strlen(a), lb = strlen(b), ls = strlen(sep);
	char *s = malloc(la + ls + lb + 1);
	if (s) {
		memcpy(s, a, la);
		memcpy(s + la, sep, ls);
		memcpy(s + la + ls, b, lb + 1);
	}
	return s;
}

static int copy_tokenizer(struct gguf_writer *w, const struct mk_config *c, char *err, size_t err_size)
{
	struct gguf_ctx *g;
	struct errbuf e = {0};
	if (gguf_open(&g, c->tokenizer_from, &e)) {
		snprintf(err, err_size, "tokenizer source: %s", e.msg);
		return -1;
	}
	struct gguf_arr a;
	int rc = 0;
	if (gguf_get_arr(g, "tokenizer.ggml.tokens", &a, &e) || (int64_t)a.count != c->vocab) {
		snprintf(err, err_size, "%s: tokenizer has %lld tokens, the model needs %lld",
		         c->tokenizer_from, e.msg[0] ? -1LL : (long long)a.count, (long long)c->vocab);
		rc = -1;
		goto out;
	}
	for (int64_t i = 0; i < gguf_n_kv(g); i++)
		if (strncmp(gguf_kv_key(g, i), "tokenizer.", 10) == 0 && gguf_writer_copy_kv(w, g, i)) {
			snprintf(err, err_size, "cannot copy key %s", gguf_kv_key(g, i));
			rc = -1;
			goto out;
		}
out:
	gguf_close(g);
	return rc;
}

int mkmodel_vocab(struct gguf_writer *w, const struct mk_config *c, char *err, size_t err_size)
{
	if (c->tokenizer_from)
		return copy_tokenizer(w, c, err, err_size);
	bool glm = strcmp(c->arch, "glm-dsa") == 0;
	const struct special *sp = glm ? glm_specials : ds_specials;
	size_t n_sp = glm ? sizeof(glm_specials) / sizeof(glm_specials[0])
	                  : sizeof(ds_specials) / sizeof(ds_specials[0]);
	int64_t V = c->vocab, first_free = glm ? 0 : 3;
	int64_t limit = glm ? 154820 : 128000; /* where the special / placeholder ids begin */
	if (V < limit + (glm ? 31 : 815)) {
		snprintf(err, err_size, "vocab %lld is too small for the %s special tokens", (long long)V,
		         c->arch);
		return -1;
	}
	char **tok = calloc((size_t)V, sizeof(*tok));
	int32_t *type = calloc((size_t)V, sizeof(*type));
	size_t n_words = sizeof(words) / sizeof(words[0]);
	size_t max_merges = n_words * 2 * 16;
	char **merges = calloc(max_merges, sizeof(*merges));
	struct sset S = {.cap = 1u << 15};
	S.slot = calloc(S.cap, sizeof(*S.slot));
	struct mtab M = {.cap = 1u << 15};
	M.key = calloc(M.cap, sizeof(*M.key));
	M.rank = calloc(M.cap, sizeof(*M.rank));
	int rc = -1;
	size_t n_merges = 0;
	if (!tok || !type || !merges || !S.slot || !M.key || !M.rank) {
		snprintf(err, err_size, "out of memory");
		goto out;
	}
	char sym[256][4];
	int order[256];
	byte_symbols(sym);
	byte_order(order);
	int64_t id = first_free;
	for (int i = 0; i < 256; i++, id++) {
		tok[id] = strdup(sym[order[i]]);
		type[id] = 1;
		if (!tok[id] || !sset_add(&S, tok[id]))
			goto oom;
	}
	/* merges: for each word (without, then with a leading space Ġ), run BPE with the merges so far
	 * and add merges joining the resulting pieces left to right. A new merge ranks after all
	 * earlier ones, so words already reachable keep their tokenization and every listed word
	 * becomes one token. */
	for (int sp_pass = 0; sp_pass < 2; sp_pass++) {
		for (size_t wi = 0; wi < n_words; wi++) {
			char *pc[64];
			int np = 0;
			const char *word = words[wi];
			if (sp_pass)
				pc[np++] = strdup(sym[' ']);
			for (size_t k = 0; word[k] && np < 63; k++)
				pc[np++] = strdup(sym[(uint8_t)word[k]]);
			bool fail = false, full = false;
			for (int i = 0; i < np; i++)
				fail |= !pc[i];
			while (!fail && np > 1) { /* BPE with the current merges */
				int best = -1;
				int64_t best_rank = INT64_MAX;
				for (int i = 0; i + 1 < np; i++) {
					char key[160];
					snprintf(key, sizeof(key), "%s %s", pc[i], pc[i + 1]);
					int64_t r = mtab_find(&M, key);
					if (r >= 0 && r < best_rank) {
						best_rank = r;
						best = i;
					}
				}
				if (best < 0)
					break;
				char *j = join(pc[best], pc[best + 1], "");
				fail |= !j;
				free(pc[best]);
				free(pc[best + 1]);
				pc[best] = j;
				memmove(&pc[best + 1], &pc[best + 2],
				        sizeof(pc[0]) * (size_t)(np - best - 2));
				np--;
			}
			while (!fail && !full && np > 1) { /* new merges for what is left */
				char *key = join(pc[0], pc[1], " "), *t = join(pc[0], pc[1], "");
				if (!key || !t || n_merges >= max_merges) {
					free(key);
					free(t);
					fail = !key || !t;
					full = true;
					break;
				}
				if (sset_add(&S, t)) {
					if (id >= limit) {
						free(key);
						free(t); /* the set is not used after this */
						full = true;
						break;
					}
					tok[id] = t;
					type[id++] = 1;
				} else {
					free(t);
					t = NULL;
				}
				merges[n_merges] = key;
				mtab_add(&M, key, (int64_t)n_merges);
				n_merges++;
				char *j = join(pc[0], pc[1], "");
				fail |= !j;
				free(pc[0]);
				free(pc[1]);
				pc[0] = j;
				memmove(&pc[1], &pc[2], sizeof(pc[0]) * (size_t)(np - 2));
				np--;
			}
			for (int i = 0; i < np; i++)
				free(pc[i]);
			if (fail)
				goto oom;
			if (full)
				goto merges_done;
		}
	}
merges_done:
	for (size_t i = 0; i < n_sp; i++) {
		tok[sp[i].id] = strdup(sp[i].text);
		type[sp[i].id] = 3;
		if (!tok[sp[i].id])
			goto oom;
	}
	if (!glm)
		for (int64_t i = 128000; i < 128800; i++) {
			char b[64];
			snprintf(
			    b, sizeof(b),
			    "<\xef\xbd\x9cplace\xe2\x96\x81holder\xe2\x96\x81no\xe2\x96\x81%lld\xef\xbd\x9c>",
			    (long long)(i - 128000));
			tok[i] = strdup(b);
			type[i] = 3;
			if (!tok[i])
				goto oom;
		}
	for (int64_t i = 0; i < V; i++)
		if (!tok[i]) {
			char b[32];
			snprintf(b, sizeof(b), "[PAD%lld]", (long long)i);
			tok[i] = strdup(b);
			type[i] = 5;
			if (!tok[i])
				goto oom;
		}

	rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
	rc |= gguf_writer_set_str(w, "tokenizer.ggml.pre", glm ? "glm4" : "deepseek-v3");
	rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)V);
	rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, type, (uint64_t)V);
	rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
	if (glm) {
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 154820);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 154821);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 154822);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", 154827);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 154820);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eom_token_id", 154829);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.fim_pre_token_id", 154838);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.fim_mid_token_id", 154839);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.fim_suf_token_id", 154840);
		rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
		rc |= gguf_writer_set_str(w, "tokenizer.chat_template", GLM_TEMPLATE);
	} else {
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1);
		rc |= gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 1);
		rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
		rc |= gguf_writer_set_str(w, "tokenizer.chat_template", DS_TEMPLATE);
	}
	rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
	if (rc) {
		snprintf(err, err_size, "cannot set tokenizer keys (%d)", rc);
		rc = -1;
	}
	goto out;
oom:
	snprintf(err, err_size, "out of memory building the vocabulary");
	rc = -1;
out:
	/* strings in tok[] own themselves; the set only borrows them (the extra merge strings that
	 * lost the dedup were freed above) */
	for (int64_t i = 0; tok && i < V; i++)
		free(tok[i]);
	for (size_t i = 0; merges && i < n_merges; i++)
		free(merges[i]);
	free(tok);
	free(type);
	free(merges);
	free(S.slot);
	free(M.key);
	free(M.rank);
	return rc;
}
