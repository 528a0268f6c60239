// Unit tests of the chat-template interpreter (a Jinja2 subset) and the chat API. Expected
// strings follow Jinja2's documented semantics in HF's configuration (trim_blocks,
// lstrip_blocks); tests/text/test_template_snippets.py checks the same ground against
// python3-jinja2 itself.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "core/file.h"
#include "text/chat.h"
#include "text/template.h"

namespace atlas::tmpl {
namespace {

std::string render(const std::string& src, const Variables& vars = {}) {
  return Template::parse(src, "t").render(vars);
}

std::string error_of(const std::string& src, const Variables& vars = {}) {
  try {
    render(src, vars);
  } catch (const atlas::Error& e) {
    return e.what();
  }
  return "<no error>";
}

Value msgs() {
  return Value::from_json(json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"},
                                          {"role":"assistant","content":"Yo"}])"));
}

TEST(Template, TextAndOutput) {
  EXPECT_EQ(render("plain"), "plain");
  EXPECT_EQ(render("{{ 'a' ~ 1 }}"), "a1");
  EXPECT_EQ(render("a{# comment #}b"), "ab");
  EXPECT_EQ(render("x\n"), "x");  // one trailing newline of the source is dropped
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(Template, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(render("a \n {%- if true -%} \n x {%- endif %}"), "ax");
  // trim_blocks: newline after a block tag goes; after {{ }} it stays.
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\n{{ 'y' }}\nz"), "x\ny\nz");
  // lstrip_blocks: indentation before a block tag or comment goes, not before {{ }}.
  EXPECT_EQ(render("a\n    {% if true %}\n  x\n    {% endif %}\nb"), "a\n  x\nb");
  EXPECT_EQ(render("a\n  {# c #}\nb"), "a\nb");
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");
  // Not at a line start: kept. {%+ disables lstrip; +%} disables trim.
  EXPECT_EQ(render("a  {% if true %}x{% endif %}"), "a  x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Template, LiteralsPrintLikePython) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}"), "[1, 'a', None, True, 1.5, {'k': 'v'}]");
  EXPECT_EQ(render("{{ (1,) }} {{ (1, 2) }} {{ () }}"), "(1,) (1, 2) ()");
  EXPECT_EQ(render("{{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 3.0 }} {{ 0.1 + 0.2 }}"),
            "1e+20 1e+16 1000000000000000.0 1e-05 0.0001 3.0 0.30000000000000004");
  EXPECT_EQ(render("{{ [\"it's\", 'q\"', 'b\\\\', '\\n', '\\x01', 'é'] }}"),
            "[\"it's\", 'q\"', 'b\\\\', '\\n', '\\x01', 'é']");
  EXPECT_EQ(render("{{ none }}|{{ undefined_thing }}|"), "None||");
}

TEST(Template, Arithmetic) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ -2 ** 2 }}"), "3 -4 2 3.5 1024 4");
  EXPECT_EQ(render("{{ 'ab' * 2 }} {{ [1] + [2] }} {{ true + 1 }} {{ 1 + 2 * 3 }}"), "abab [1, 2] 2 7");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 3 not in [1] }} {{ 'k' in {'k': 1} }}"),
            "True True True True True");
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not none }} {{ 'a' if false else 'b' }} [{{ 'c' if false }}]"),
            "x y True b []");
}

TEST(Template, SubscriptsAttributesSlices) {
  Variables v{{"messages", msgs()}};
  EXPECT_EQ(render("{{ messages[1].role }} {{ messages[-1]['content'] }} [{{ messages[9] }}] [{{ messages[0].nope }}]", v),
            "user Yo [] []");
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ [1, 2, 3][1:] }} {{ 'héllo'[1] }}"), "bcd fedcba [2, 3] é");
  EXPECT_EQ(render("{{ messages[1:] | length }}", v), "2");
}

TEST(Template, IfElifElse) {
  EXPECT_EQ(render("{% if x == 1 %}a{% elif x == 2 %}b{% else %}c{% endif %}", {{"x", Value(2)}}), "b");
  EXPECT_EQ(render("{% if x %}a{% else %}c{% endif %}", {{"x", Value("")}}), "c");
}

TEST(Template, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }} {% endfor %}"),
            "103TrueFalse3 212FalseFalse3 321FalseTrue3 ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"), "2/2 4/2 ");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
                   "{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "aba");
}

TEST(Template, ScopingMatchesJinja) {
  // A loop body's assignments stay in the iteration; `if` does not open a scope.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}"), "01020");
  EXPECT_EQ(render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");
  // namespace() is how templates carry state out of loops.
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]"), "[in1]");
}

TEST(Template, Macros) {
  EXPECT_EQ(render("{% macro g(n, p='!') %}Hi {{ n }}{{ p }}{% endmacro %}{{ g('A') }} {{ g('B', p='?') }}"), "Hi A! Hi B?");
}

TEST(Template, Tests) {
  Variables v{{"s", Value("x")}, {"n", Value::none()}, {"d", Value::dict()}, {"l", Value::list()}};
  EXPECT_EQ(render("{{ s is defined }} {{ q is defined }} {{ q is undefined }} {{ n is none }} {{ s is string }}", v),
            "True False True True True");
  EXPECT_EQ(render("{{ d is mapping }} {{ l is sequence }} {{ 3 is number }} {{ l is iterable }} {{ true is true }} "
                   "{{ 1 is true }} {{ n is not none }} {{ 9 is divisibleby 3 }}",
                   v),
            "True True True True True False False True");
}

TEST(Template, Filters) {
  Variables v{{"messages", msgs()}};
  EXPECT_EQ(render("[{{ '  a b \n' | trim }}] {{ 'héllo' | length }} {{ [1, 2] | count }} {{ 'aB' | lower }}{{ 'aB' | upper }}"),
            "[a b] 5 2 abAB");
  EXPECT_EQ(render("{{ q | default('d') }} {{ '' | default('e', true) }} {{ q | d('x') }}"), "d e x");
  EXPECT_EQ(render("{{ [1, 2, 3] | join(', ') }} {{ 'aXb' | replace('X', '-') }} {{ [4, 5] | first }}{{ [4, 5] | last }}"),
            "1, 2, 3 a-b 45");
  EXPECT_EQ(render("{{ 'ab' | list }} {{ 5 | string ~ '!' }} {{ '12' | int + 1 }} {{ 'x' | int }}"), "['a', 'b'] 5! 13 0");
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join }}", v), "Hi");
  EXPECT_EQ(render("{{ messages | rejectattr('role', 'in', ['system', 'user']) | map(attribute='role') | list }}", v),
            "['assistant']");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | items | list }}"), "[('b', 1), ('a', 2)]");
}

TEST(Template, TojsonIsHfJsonDumps) {
  // HF's tojson: json.dumps(ensure_ascii=False) with Python's default separators, keys in order.
  EXPECT_EQ(render("{{ {'b': [1, 2.0, 'é<>&\"'], 'a': none, 't': true} | tojson }}"),
            "{\"b\": [1, 2.0, \"é<>&\\\"\"], \"a\": null, \"t\": true}");
  EXPECT_EQ(render("{{ 'é😀\\x7f' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\\u007f\"");
  EXPECT_EQ(render("{{ {'a': [1], 'e': []} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ],\n  \"e\": []\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | tojson(separators=(',', ':'), sort_keys=true) }}"), "{\"a\":2,\"b\":1}");
  EXPECT_EQ(render("{{ '\\n\\t\\x01' | tojson }}"), "\"\\n\\t\\u0001\"");
}

TEST(Template, StringAndDictMethods) {
  EXPECT_EQ(render("[{{ ' x '.strip() }}|{{ 'xxayy'.lstrip('x') }}|{{ 'ab\\n\\n'.rstrip('\\n') }}]"), "[x|ayy|ab]");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c']");
  EXPECT_EQ(render("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'hello world'.title() }} "
                   "{{ 'ab'.replace('a', 'A') }} {{ 'ß'.upper() }}"),
            "True True Hello World Ab SS");
  EXPECT_EQ(render("{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z', 'dv') }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }}"),
            "1 dv ['a'] [1]");
  EXPECT_EQ(render("{{ 'x</think>y'.split('</think>')[-1] }}"), "y");
}

TEST(Template, HfGlobals) {
  // strftime_now formats the current time like Python's datetime.now().strftime.
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string year = std::to_string(tm.tm_year + 1900);
  std::string got = render("{{ strftime_now('%Y') }}");
  if (got != year) {
    EXPECT_EQ(got, std::to_string(tm.tm_year + 1901));  // the year may just have turned
  }
  EXPECT_EQ(render("{{ strftime_now is defined }} {{ raise_exception is defined }} {{ namespace is defined }}"),
            "True True True");
}

TEST(TemplateErrors, SyntaxErrorNamesLine) {
  std::string e = error_of("line one\nline two {% if true %}\nunclosed");
  EXPECT_NE(e.find("t: line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("endif"), std::string::npos) << e;
  e = error_of("ok\n{{ 1 + }}");
  EXPECT_NE(e.find("line 2, column 8"), std::string::npos) << e;
  e = error_of("{% for x in y %}{% endif %}");
  EXPECT_NE(e.find("unexpected 'endif', expected 'else' or 'endfor'"), std::string::npos) << e;
  e = error_of("a\nb\n{{ 'unterminated }}");
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("unterminated string"), std::string::npos) << e;
}

TEST(TemplateErrors, UnknownFilterTestTagNamed) {
  std::string e = error_of("first\nsecond {{ 'x' | frobnicate }}");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown filter 'frobnicate'"), std::string::npos) << e;
  e = error_of("{{ 1 is frob }}");
  EXPECT_NE(e.find("unknown test 'frob'"), std::string::npos) << e;
  e = error_of("{% include 'x' %}");
  EXPECT_NE(e.find("'include' statement is not supported"), std::string::npos) << e;
  e = error_of("{{ 'x'.frob() }}");
  EXPECT_NE(e.find("frob"), std::string::npos) << e;
}

TEST(TemplateErrors, RaiseExceptionMessageSurfaces) {
  std::string e = error_of("a\n{% if n > 1 %}{{ raise_exception('Roles must alternate: ' ~ n) }}{% endif %}", {{"n", Value(2)}});
  EXPECT_NE(e.find("Roles must alternate: 2"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
}

TEST(TemplateErrors, RunawayNestingIsAnErrorNotACrash) {
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("recursion depth"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}").find("nested too deeply"),
            std::string::npos);
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_NE(error_of("{{ " + nots + "1 }}").find("nested too deeply"), std::string::npos);
  EXPECT_EQ(render("{{ not not not 1 }} {{ - - 1 }} {{ ((((((((((1)))))))))) }}"), "False 1 1");
}

TEST(TemplateErrors, RuntimeTypeErrors) {
  EXPECT_NE(error_of("{{ nope.attr }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("concatenate"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.a = 2 %}").find("non-namespace"), std::string::npos);
  EXPECT_NE(error_of("{{ {}.items }}").find("cannot print the function"), std::string::npos);
  EXPECT_NE(error_of("{% for x in none %}{% endfor %}").find("not iterable"), std::string::npos);
}

}  // namespace
}  // namespace atlas::tmpl

namespace atlas {
namespace {

const char* kDeepSeekV2Like =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + "
    "'\n\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

TEST(Chat, RendersWithoutAddingBos) {
  ChatTemplate t(kDeepSeekV2Like);
  json m = json::parse(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}])");
  std::string s = t.apply(m, {.bos_token = "<B>", .eos_token = "<E>", .add_generation_prompt = true});
  EXPECT_EQ(s, "<B>User: Hi\n\nAssistant: Yo<E>Assistant:");
  EXPECT_EQ(t.apply(m, {.bos_token = "<B>", .eos_token = "<E>"}), "<B>User: Hi\n\nAssistant: Yo<E>");
}

TEST(Chat, ExtraVariablesAndUndefinedTokens) {
  ChatTemplate t("{{ bos_token is defined }} {{ tools is none }} {{ enable_thinking }}");
  ChatOptions o;
  o.extra["enable_thinking"] = false;
  EXPECT_EQ(t.apply(json::array(), o), "False True False");
}

TEST(Chat, KeyOrderOfOrderedMessagesIsKept) {
  ChatTemplate t("{{ messages[0] | tojson }}");
  ojson m = ojson::parse(R"([{"role":"user","content":"x"}])");
  EXPECT_EQ(t.apply(m), "{\"role\": \"user\", \"content\": \"x\"}");
}

TEST(Chat, BadMessagesNameTheElement) {
  ChatTemplate t("x");
  try {
    t.apply(json::parse(R"([{"role":"user"}, 3])"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages: [1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.apply(json::parse(R"({"role":"user"})")), Error);
}

TEST(Chat, SelectTemplateStringOrNamedList) {
  EXPECT_EQ(select_chat_template(json("T"), "cfg"), "T");
  json list = json::parse(R"([{"name":"tool_use","template":"A"},{"name":"default","template":"B"}])");
  EXPECT_EQ(select_chat_template(list, "cfg"), "B");
  EXPECT_EQ(select_chat_template(list, "cfg", "tool_use"), "A");
  try {
    select_chat_template(list, "cfg", "rag");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tool_use, default"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_chat_template(json(3), "cfg"), Error);
}

TEST(Chat, SpecialTokenStringOrObject) {
  json cfg = json::parse(R"({"bos_token":{"__type":"AddedToken","content":"<s>"},"eos_token":"</s>","pad_token":null})");
  EXPECT_EQ(special_token_text(cfg, "bos_token", "c"), "<s>");
  EXPECT_EQ(special_token_text(cfg, "eos_token", "c"), "</s>");
  EXPECT_EQ(special_token_text(cfg, "pad_token", "c"), std::nullopt);
  EXPECT_EQ(special_token_text(cfg, "unk_token", "c"), std::nullopt);
  EXPECT_THROW(special_token_text(json::parse(R"({"bos_token":5})"), "bos_token", "c"), Error);
}

TEST(Chat, TemplateSyntaxErrorNamesOrigin) {
  try {
    ChatTemplate t("{% if %}", "model/tokenizer_config.json: chat_template");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model/tokenizer_config.json: chat_template: line 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atlas
