/* Pre-tokenizer regexes (MODEL-SPEC.md §4.5): the text between special tokens is split into
 * pieces by one or more regexes applied in sequence, each splitting every piece of the previous
 * step and keeping both its matches and the text between them. The patterns are the Hugging Face
 * tokenizer.json ones for each family (HF `tokenizers` is the reference for the expected ids),
 * compiled with PCRE2 (UTF, UCP, JIT). Two details keep PCRE2 equal to HF's Oniguruma:
 *  - `\s` / `\S` are rewritten to the Unicode White_Space set (Oniguruma's \s); PCRE2's UCP \s
 *    lacks U+0085;
 *  - the contractions keep HF's case-insensitive group `(?i:'s|...)`, which (unlike llama.cpp's
 *    expanded `'[sS]`) also folds U+017F LATIN SMALL LETTER LONG S, as Oniguruma does. */
#include <stdlib.h>
#include <string.h>

#include "common/base/log.h"
#include "common/tok/tok_internal.h"

struct pre_def {
	const char *name;
	enum tok_pre pre;
};

static const struct pre_def pre_names[] = {
    {"gpt2", TOK_PRE_GPT2},
    {"default", TOK_PRE_GPT2},
    {"llama-bpe", TOK_PRE_LLAMA3},
    {"llama3", TOK_PRE_LLAMA3},
    {"glm4", TOK_PRE_GLM4},
    {"chatglm-bpe", TOK_PRE_GLM4},
    {"deepseek-v3", TOK_PRE_DEEPSEEK_V3},
    {"deepseek-llm", TOK_PRE_DEEPSEEK_LLM},
    {"qwen2", TOK_PRE_QWEN2},
};

int tok_pre_from_name(const char *name, enum tok_pre *out)
{
	for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]); i++) {
		if (strcmp(name, pre_names[i].name) == 0) {
			*out = pre_names[i].pre;
			return 0;
		}
	}
	return ERR_NOTFOUND;
}

#define RE_CONTRACTIONS_I "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

static const char *const re_gpt2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_llama3[] = {
    RE_CONTRACTIONS_I "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_qwen2[] = {
    RE_CONTRACTIONS_I "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const re_deepseek_v3[] = {
    "\\p{N}{1,3}",
    "[\\x{4e00}-\\x{9fa5}\\x{3040}-\\x{309f}\\x{30a0}-\\x{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
/* DeepSeek LLM (v1/v2) tokenizer.json: the Latin/Greek/Cyrillic/... letter class is the explicit
 * list HF ships (code point ranges). */
static const char *const re_deepseek_llm[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}"
    "\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}"
    "\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}\\x{48a}-\\x{52f}\\x{531}-\\x{556}"
    "\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"
    "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}"
    "\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}"
    "\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}"
    "\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"
    "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}"
    "\\x{212f}-\\x{2134}\\x{2139}\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}"
    "\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}"
    "\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}"
    "\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"
    "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"
    "\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+",
    "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4e00}-\\x{9fa5}\\x{800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
    "\\p{N}+",
    NULL,
};

/* Oniguruma's \s: the Unicode White_Space property. */
#define WS_SET                                                                                               \
	"\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"                   \
	"\\x{202f}\\x{205f}\\x{3000}"

/* Rewrites \s and \S of a pattern into explicit White_Space classes. */
static char *rewrite_space(const char *p)
{
	size_t n = strlen(p), n_esc = 0, o = 0;
	for (size_t i = 0; i < n; i++)
		n_esc += p[i] == '\\';
	size_t cap = n + n_esc * (sizeof("[^" WS_SET "]") + 1) + 1; /* every escape may grow */
	char *out = malloc(cap);
	if (!out)
		return NULL;
	bool in_class = false;
	for (size_t i = 0; i < n; i++) {
		char c = p[i];
		if (c == '\\' && i + 1 < n) {
			char d = p[i + 1];
			const char *rep = NULL;
			if (d == 's')
				rep = in_class ? WS_SET : "[" WS_SET "]";
			else if (d == 'S' && !in_class)
				rep = "[^" WS_SET "]";
			if (rep) {
				size_t k = strlen(rep);
				if (o + k + 1 > cap)
					goto toolong;
				memcpy(out + o, rep, k);
				o += k;
			} else {
				if (o + 3 > cap)
					goto toolong;
				out[o++] = c;
				out[o++] = d;
			}
			i++;
			continue;
		}
		if (c == '[' && !in_class) {
			in_class = true;
			if (o + 4 > cap)
				goto toolong;
			out[o++] = c;
			/* a ']' or '^]' right after '[' is literal */
			if (i + 1 < n && p[i + 1] == '^')
				out[o++] = p[++i];
			if (i + 1 < n && p[i + 1] == ']')
				out[o++] = p[++i];
			continue;
		}
		if (c == ']' && in_class)
			in_class = false;
		if (o + 2 > cap)
			goto toolong;
		out[o++] = c;
	}
	out[o] = '\0';
	return out;
toolong:
	free(out);
	return NULL;
}

int tok_pretok_compile(struct tok_pretok *pt, enum tok_pre pre, struct errbuf *e)
{
	const char *const *list;
	switch (pre) {
	case TOK_PRE_LLAMA3:
	case TOK_PRE_GLM4: list = re_llama3; break;
	case TOK_PRE_QWEN2: list = re_qwen2; break;
	case TOK_PRE_DEEPSEEK_V3: list = re_deepseek_v3; break;
	case TOK_PRE_DEEPSEEK_LLM: list = re_deepseek_llm; break;
	case TOK_PRE_GPT2:
	default: list = re_gpt2; break;
	}
	memset(pt, 0, sizeof(*pt));
	for (int i = 0; list[i]; i++) {
		TD_ASSERT(i < TOK_MAX_REGEX);
		char *pat = rewrite_space(list[i]);
		if (!pat)
			return errbuf_set(e, -ENOMEM, "pre-tokenizer: out of memory");
		int err;
		PCRE2_SIZE erroff;
		pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
		                               &err, &erroff, NULL);
		free(pat);
		if (!re) {
			PCRE2_UCHAR msg[160];
			pcre2_get_error_message(err, msg, sizeof(msg));
			tok_pretok_free(pt);
			return errbuf_set(e, ERR_FORMAT, "pre-tokenizer regex %d: %s at offset %zu", i,
			                  (const char *)msg, (size_t)erroff);
		}
		/* JIT is an optimisation: without it (no JIT support) the interpreter gives the
		 * same matches */
		(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
		pt->re[pt->n_re++] = re;
	}
	return 0;
}

void tok_pretok_free(struct tok_pretok *pt)
{
	for (int i = 0; i < pt->n_re; i++)
		pcre2_code_free(pt->re[i]);
	pt->n_re = 0;
}
