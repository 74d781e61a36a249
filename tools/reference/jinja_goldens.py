#!/usr/bin/env python3
"""Jinja snippet goldens for the C++ template engine (src/text/jinja).

Each snippet is rendered with the very environment transformers 5.17 builds for chat templates
(`transformers.utils.chat_template_utils._compile_jinja_template`: ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True, loopcontrols, HF's own tojson / raise_exception / strftime_now),
so the C++ engine is checked against exactly what `apply_chat_template` runs.

Run:  /opt/refvenv/bin/python tools/reference/jinja_goldens.py  (or python3 on the GPU machine)
Writes tests/fixtures/jinja_goldens.json: a list of
  {"name", "template", "context", "expected"}                      on success, or
  {"name", "template", "context", "error": {"type", "message", "line"}}  when jinja2 raises.
"line" is the template line jinja2 reports (syntax errors) or the last template frame of the traceback.
"""
import json
import os
import sys
import traceback

import jinja2
import transformers
from transformers.utils.chat_template_utils import _compile_jinja_template

SNIPPETS = []


def S(name, template, context=None):
    SNIPPETS.append((name, template, context or {}))


# --- output, literals, str() of values -----------------------------------------------------------------
S("text_only", "hello world")
S("print_int", "{{ 42 }}")
S("print_neg_float", "{{ -1.5 }}")
S("print_floats", "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 123456789.125 }} {{ 1e100 }} {{ 0.0001 }}")
S("print_float_ops", "{{ 2 / 4 }} {{ 10 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
S("print_float_mod", "{{ 7.5 % 2 }} {{ -7.5 // 2 }} {{ 3 * 1.5 }}")
S("print_bools_none", "{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}")
S("print_list", "{{ [1, 'a', none, true, 1.5, [2]] }}")
S("print_dict", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': 'e'}} }}")
S("print_tuple", "{{ (1, 2) }} {{ (1,) }} {{ () }}")
S("print_str_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'back\\\\slash'] }}")
S("print_unicode_repr", "{{ ['héllo', '日本', '\\x01', '\\x7f', '\\u00a0'] }}")
S("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\101' }}")
S("string_concat_adjacent", "{{ 'a' 'b' \"c\" }}")
S("context_values", "{{ s }}|{{ i }}|{{ f }}|{{ b }}|{{ n }}|{{ l }}|{{ d }}",
  {"s": "str", "i": 7, "f": 2.5, "b": True, "n": None, "l": [1, "x"], "d": {"k": [True, None]}})
S("undefined_prints_empty", "[{{ nothing }}][{{ d.missing }}]", {"d": {}})
S("integer_literals", "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1_0.5 }}")
S("big_int_math", "{{ 2 ** 40 }} {{ 12345678 * 87654321 }}")

# --- whitespace control (HF: trim_blocks=True, lstrip_blocks=True) ------------------------------------
S("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
S("lstrip_blocks", "line\n    {% if true %}\n    indented\n    {% endif %}\nend")
S("lstrip_not_for_variables", "    {{ 'x' }}\n  {% if true %}y{% endif %}")
S("minus_strips_both", "a   \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c")
S("minus_on_variables", "a  {{- 'b' -}}  c\n{{ 'd' }}\n")
S("plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}")
S("plus_disables_trim", "{% if true +%}\nkeep\n{%- endif %}")
S("comment_trim", "a\n{# comment #}\nb\n  {#- c2 -#}  \nc")
S("comment_lstrip", "a\n    {# comment #}\nb")
S("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}")
S("raw_block_ws", "a\n  {%- raw -%}  x {{ y }}  {%- endraw -%}  \nb")
S("trailing_newline_dropped", "abc\n")
S("crlf_normalized", "a\r\nb\rc\n{% if true %}\r\nd{% endif %}")
S("lstrip_after_text_on_line", "text {% if true %}x{% endif %}\n  {% if true %}y{% endif %}")
S("lstrip_tabs", "\t\t{% if true %}z{% endif %}")
S("lstrip_unicode_space_not_stripped", "\u00a0{% if true %}z{% endif %}")
S("minus_unicode_space", "a\u3000{%- if true %}z{% endif %}")

# --- set, namespace, scoping -------------------------------------------------------------------------
S("set_simple", "{% set x = 3 %}{{ x * 2 }}")
S("set_tuple_unpack", "{% set a, b = 1, 2 %}{{ a }}-{{ b }}")
S("set_block", "{% set x %}hello {{ 'world' }}{% endset %}[{{ x }}]")
S("set_block_filter", "{% set x | upper | trim %}  hello  {% endset %}[{{ x }}]")
S("namespace_attr", "{% set ns = namespace(a=1, b='x') %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ ns.b }}")
S("namespace_in_loop", "{% set ns = namespace(total=0) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}")
S("loop_scope_does_not_leak", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}")
S("if_scope_leaks", "{% if true %}{% set y = 7 %}{% endif %}{{ y }}")
S("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
S("namespace_missing_attr", "[{{ namespace(a=1).zz }}]")
S("set_nonnamespace_attr_error", "{% set d = {} %}{% set d.x = 1 %}")

# --- if / elif / else --------------------------------------------------------------------------------
S("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %},{% endfor %}")
S("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}")
S("and_or_values", "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' or none }} {{ none and 1 }} {{ [] or [1] }}")
S("not_precedence", "{{ not 1 == 2 }} {{ not true and false }} {{ not (true and false) }}")
S("ternary", "{{ 'a' if true else 'b' }}{{ 'c' if false else 'd' }}[{{ 'e' if false }}]")
S("ternary_chain", "{{ 'a' if x == 1 else 'b' if x == 2 else 'c' }}", {"x": 2})

# --- for loops ---------------------------------------------------------------------------------------
S("for_loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}")
S("for_previtem_nextitem", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}")
S("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}")
S("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}")
S("for_else_filtered", "{% for x in [1, 2] if x > 5 %}x{% else %}none-left{% endfor %}")
S("for_if_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}/{{ loop.length }} {% endfor %}")
S("for_tuple_unpack", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}")
S("for_dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}})
S("for_dict_keys_order", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}})
S("for_items_filter", "{% for k, v in d|items %}{{ k }}:{{ v }} {% endfor %}", {"d": {"b": 1, "a": [1]}})
S("for_string", "{% for c in 'héllo' %}{{ c }}.{% endfor %}")
S("for_nested_loop", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}")
S("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
S("for_recursive", "{% for item in tree recursive %}{{ item.name }}{% if item.children %}({{ loop(item.children) }}){% endif %}{% endfor %}",
  {"tree": [{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c"}]}, {"name": "d"}]})
S("for_recursive_depth", "{% for item in tree recursive %}{{ loop.depth }}{{ loop.depth0 }}{% if item.c %}{{ loop(item.c) }}{% endif %}{% endfor %}",
  {"tree": [{"c": [{"c": [{}]}]}]})
S("for_changed", "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }},{% endfor %}")
S("loop_method_outlives_loop", "{% set ns = namespace() %}{% for x in [1, 2] %}{% set ns.c = loop.changed %}{% set ns.l = loop %}{% endfor %}{{ ns.c(1) }}{{ ns.c(1) }}{{ ns.l.index }}{{ ns.l.length }}")
S("for_undefined_iterable", "[{% for x in nope %}{{ x }}{% endfor %}]")
S("for_reverse_slice", "{% for m in msgs[::-1] %}{{ m }}{{ loop.index0 }} {% endfor %}", {"msgs": ["a", "b", "c"]})
S("loop_outside_is_undefined", "[{{ loop is defined }}]")

# --- macros ------------------------------------------------------------------------------------------
S("macro_defaults", "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}")
S("macro_returns_string", "{% macro m(x) %}  {{ x }}  {% endmacro %}[{{ m('v')|trim }}]{{ m('w')|length }}")
S("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}")
S("macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inner{% endcall %}")
S("macro_caller_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}<{{ v }}>{% endcall %}")
S("macro_sees_globals", "{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {"g": "global"})
S("macro_namespace_side_effect", "{% set c = namespace(n=0) %}{% macro inc() %}{% set c.n = c.n + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ c.n }}")
S("macro_recursion", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}")
S("macro_too_many_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}")
S("macro_unknown_kwarg", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, zz=2) }}")
S("macro_missing_arg_undefined", "{% macro m(a, b) %}[{{ b }}]{% endmacro %}{{ m(1) }}")
S("macro_attributes", "{% macro m(a, b=1) %}{% endmacro %}{{ m.name }} {{ m.arguments }}")

# --- filters -----------------------------------------------------------------------------------------
S("filter_tojson_basic", "{{ d | tojson }}", {"d": {"b": 1, "a": [1, 2.5, "x", None, True], "é": "ü\n\"\\"}})
S("filter_tojson_indent", "{{ d | tojson(indent=2) }}", {"d": {"b": 1, "a": [1, {"c": []}, {}], "s": "x"}})
S("filter_tojson_indent_positional", "{{ [1, [2]] | tojson(4) }}")
S("filter_tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", {"d": {"a": [1, 2], "b": "c"}})
S("filter_tojson_sort_keys", "{{ d | tojson(sort_keys=true) }}", {"d": {"b": 1, "a": 2, "C": 3}})
S("filter_tojson_ensure_ascii", "{{ 'é日😀' | tojson(ensure_ascii=true) }}")
S("filter_tojson_floats", "{{ [1.0, 0.1, 1e20, 1e-7, -0.0, 3.14159, 100.0, 1.5e300] | tojson }}")
S("filter_tojson_controls", "{{ '\\x00\\x1f\\x7f\\u2028\\b\\f\\r' | tojson }}")
S("filter_tojson_int_keys", "{{ {1: 'a', true: 'b', none: 'c', 2.5: 'd'} | tojson }}")
S("filter_tojson_undefined_error", "{{ nope | tojson }}")
S("filter_trim", "[{{ '  a b \\n\\t' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ '\u3000u\u00a0' | trim }}]")
S("filter_length", "{{ 'héllo' | length }} {{ [1, 2] | length }} {{ {'a': 1} | length }} {{ nope | length }} {{ 'ab' | count }}")
S("filter_string", "{{ 1 | string }}{{ [1, 'a'] | string }}{{ none | string }}[{{ nope | string }}]")
S("filter_safe_escape", "{{ '<a href=\"x\">&\\'' | e }} {{ '<b>' | safe }} {{ '<i>' | escape | escape }}")
S("markup_plus_escapes", "{{ ('<b>' | safe) + '<i>' }} {{ '<i>' + ('<b>' | safe) }} {{ ('<b>' | safe) ~ '<i>' }}")
S("filter_case", "{{ 'hello World' | upper }} {{ 'HeLLo' | lower }} {{ 'hello world' | capitalize }} {{ 'hello wORLD-foo(bar' | title }}")
S("filter_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | replace('', '-') }}")
S("filter_join", "{{ [1, 'a', none] | join(', ') }}|{{ ['x', 'y'] | join }}|{{ users | join(',', attribute='name') }}",
  {"users": [{"name": "u1"}, {"name": "u2"}]})
S("filter_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ 'abc' | last }} [{{ [] | first }}]")
S("filter_default", "{{ nope | default('dflt') }} {{ nope | d('d2') }} {{ '' | default('x') }} {{ '' | default('y', true) }} {{ none | default('z') }}")
S("filter_list", "{{ 'abc' | list }} {{ {'a': 1, 'b': 2} | list }} {{ (1, 2) | list }}")
S("filter_map_attribute", "{{ users | map(attribute='name') | join(',') }}", {"users": [{"name": "a"}, {"name": "b"}]})
S("filter_map_filter", "{{ ['a', 'b'] | map('upper') | list }} {{ [1.5, 2.5] | map('int') | list }}")
S("filter_map_attribute_default", "{{ users | map(attribute='age', default=0) | list }}", {"users": [{"age": 3}, {}]})
S("filter_select_reject", "{{ range(10) | select('odd') | list }} {{ range(10) | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }}")
S("filter_select_args", "{{ range(10) | select('divisibleby', 3) | list }} {{ [1, 2, 3] | select('in', [2, 3]) | list }}")
S("filter_selectattr", "{{ users | selectattr('active') | map(attribute='n') | list }} {{ users | rejectattr('active') | map(attribute='n') | list }}",
  {"users": [{"n": 1, "active": True}, {"n": 2, "active": False}, {"n": 3}]})
S("filter_selectattr_test", "{{ users | selectattr('n', 'equalto', 2) | list }} {{ users | selectattr('n', '>', 1) | map(attribute='n') | list }}",
  {"users": [{"n": 1}, {"n": 2}, {"n": 3}]})
S("filter_selectattr_defined", "{{ msgs | selectattr('tool_calls', 'defined') | list | length }}",
  {"msgs": [{"role": "a", "tool_calls": []}, {"role": "b"}]})
S("filter_sort", "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}")
S("filter_sort_attribute", "{{ users | sort(attribute='age') | map(attribute='n') | join }}",
  {"users": [{"n": "a", "age": 3}, {"n": "b", "age": 1}, {"n": "c", "age": 2}]})
S("filter_unique", "{{ [1, 2, 1, 3, 2] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }}")
S("filter_int_float", "{{ '42' | int }} {{ '42.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1f' | int(0, 16) }} {{ ' 12 ' | int }} {{ true | int }}")
S("filter_float", "{{ '1.5' | float }} {{ 'x' | float }} {{ 2 | float }} {{ none | float }} {{ '1e3' | float }}")
S("filter_abs_round", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ 2.9 | round(method='floor') }} {{ 7 | round }}")
S("filter_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}")
S("filter_wordcount", "{{ 'hello  big world_1 x-y' | wordcount }}")
S("filter_reverse", "{{ 'abc' | reverse }} {{ [1, 2, 3] | reverse | list }}")
S("filter_dictsort", "{{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ d | dictsort(by='value') }}", {"d": {"b": 2, "a": 3, "C": 1}})
S("filter_batch", "{{ range(7) | batch(3) | list }} {{ range(5) | batch(3, 'x') | list }}")
S("filter_slice", "{{ range(7) | slice(3) | list }}")
S("filter_sum_min_max", "{{ [1, 2, 3] | sum }} {{ users | sum(attribute='a') }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A'] | min }}",
  {"users": [{"a": 1}, {"a": 5}]})
S("filter_center_truncate", "[{{ 'ab' | center(6) }}] {{ 'hello world foo bar' | truncate(12) }} {{ 'hello world' | truncate(5, true) }}")
S("filter_format", "{{ '%s-%d-%05.2f-%x' | format('a', 7, 3.14159, 255) }} {{ '%(a)s' | format(a='k') }}")
S("filter_attr", "{{ d | attr('x') }}[{{ d | attr('keys') is defined }}]", {"d": {"x": 1}})
S("filter_groupby", "{% for g in users | groupby('city') %}{{ g.grouper }}:{{ g.list | map(attribute='n') | join }};{% endfor %}",
  {"users": [{"n": "a", "city": "X"}, {"n": "b", "city": "Y"}, {"n": "c", "city": "X"}]})
S("filter_chain_precedence", "{{ -3 | abs }} {{ [1, 2] | length + 1 }} {{ 'a' ~ 'b' | upper }}")
S("filter_unknown_error", "{{ 1 | nosuchfilter }}")
S("filter_unknown_in_if_is_lazy", "{% if false %}{{ 1 | nosuchfilter }}{% endif %}ok")
S("filter_items_non_mapping_error", "{% for k, v in 'abc' | items %}{% endfor %}")
S("filter_items_undefined", "[{% for k, v in nope | items %}x{% endfor %}]")
S("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}")

# --- tests -------------------------------------------------------------------------------------------
S("tests_types", "{% for v in [1, 1.5, 'a', [1], {'a': 1}, none, true] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is none }}{{ v is boolean }}{{ v is callable }};{% endfor %}")
S("tests_undefined", "{{ x is defined }}{{ x is undefined }}{{ x is none }}{{ x is string }}{{ x is iterable }}{{ x is sequence }}{{ x is mapping }}")
S("tests_true_false", "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}{{ none is none }}")
S("tests_num", "{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}")
S("tests_compare", "{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 2 is lt 1 }}{{ 2 is ge 2 }}{{ 1 is le 0 }}{{ 1 is ne 2 }}{{ 'a' is in 'abc' }}{{ 5 is in [1, 2] }}")
S("tests_is_not", "{{ 1 is not string }}{{ 'a' is not string }}{{ x is not defined }}")
S("tests_callable", "{{ range is callable }}{{ 'a'.upper is callable }}{{ 'a' is callable }}")
S("tests_lower_upper", "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'aBc' is lower }}")
S("tests_sameas", "{{ none is sameas none }}{{ 1 is sameas true }}{{ false is sameas false }}")
S("tests_filter_test", "{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}")
S("tests_markup_escaped", "{{ 'a' is escaped }}{{ ('a' | safe) is escaped }}{{ ('a' | safe) is string }}")
S("test_unknown_error", "{{ 1 is nosuchtest }}")

# --- operators ---------------------------------------------------------------------------------------
S("op_arith", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 1 + 1.5 }} {{ true + 1 }}")
S("op_string_arith", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] + [2, 3] }} {{ [0] * 3 }}")
S("op_concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] ~ nope }}")
S("op_compare", "{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 == 1.0 }}{{ 1 != '1' }}{{ none == none }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}")
S("op_in", "{{ 'a' in 'cat' }}{{ 'x' in ['x'] }}{{ 'k' in {'k': 1} }}{{ 2 not in [1] }}{{ 'z' not in 'abc' }}{{ 1 in [true] }}{{ 'a' in nope }}")
S("op_str_plus_int_error", "{{ 'a' + 1 }}")
S("op_div_zero_error", "{{ 1 / 0 }}")
S("op_undefined_add_error", "{{ nope + 1 }}")
S("op_compare_type_error", "{{ 1 < 'a' }}")
S("op_undefined_equality", "{{ nope == none }}{{ nope == nope2 }}{{ nope != 1 }}")
S("op_in_int_error", "{{ 1 in 5 }}")
S("op_neg_pos", "{{ -(3) }} {{ +3 }} {{ -1.5 }} {{ - - 2 }}")

# --- subscripts and attributes -----------------------------------------------------------------------
S("slice_list", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-1] }} {{ l[0] }} {{ l[-2:] }} {{ l[1:-1] }} {{ l[5:] }} {{ l[::-2] }}",
  {"l": [1, 2, 3, 4, 5]})
S("slice_string", "{{ s[1:3] }} {{ s[::-1] }} {{ s[-1] }} {{ s[0] }} {{ s[:] }}", {"s": "héllo"})
S("index_out_of_range_undefined", "[{{ l[10] }}][{{ l[10] is defined }}]", {"l": [1]})
S("attr_and_item", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ l.0 }} {{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }}",
  {"d": {"a": 1, "b": {"c": 2}}, "l": [9]})
S("attr_of_undefined_error", "{{ nope.attr }}")
S("attr_chain_missing_error", "{{ d.missing.x }}", {"d": {}})
S("dict_method_shadowing", "{{ d['items'] }} {{ d.items is defined }} {{ d.values() | list }} {{ d.keys() | list }}",
  {"d": {"items": "mine", "v": 1}})
S("dict_items_method", "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", {"d": {"a": 1, "b": 2}})
S("list_methods", "{{ [1, 2, 3, 2].index(2) }} {{ [1, 2, 2].count(2) }}")
S("list_append_unsafe", "{% set l = [] %}{{ l.append(1) }}{{ l }}")
S("dict_pop_unsafe", "{% set d = {'a': 1} %}{{ d.pop('a') }}")
S("dict_update_unsafe", "{% set d = {'a': 1} %}{% set _ = d.update({'b': 2}) %}{{ d }}")
S("none_attr", "[{{ n.x }}]", {"n": None})

# --- string methods ----------------------------------------------------------------------------------
S("str_startswith_endswith", "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.startswith('l', 2) }}")
S("str_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ''.split(',') }} {{ ''.split() }}")
S("str_strip", "[{{ '  x  '.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi\\n'.lstrip('\\n') }}][{{ '\\n\\nhi\\n'.rstrip('\\n') }}][{{ 'abcba'.strip('ab') }}]")
S("str_case_methods", "{{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ 'hello world'.title() }} {{ 'hello World'.capitalize() }} {{ 'aBc'.swapcase() }}")
S("str_replace_find_count", "{{ 'aXbXc'.replace('X', '-') }} {{ 'aXbXc'.replace('X', '-', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ 'hello'.index('e') }}")
S("str_join_method", "{{ ', '.join(['a', 'b']) }} {{ '-'.join('xyz') }}")
S("str_format_method", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<4}|{:^5}|{:.2f}|{:05d}'.format('r', 'l', 'c', 3.14159, 42) }}")
S("str_predicates", "{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'a1'.isalnum() }}{{ '  '.isspace() }}{{ 'abc'.islower() }}{{ 'ABC'.isupper() }}{{ ''.isdigit() }}")
S("str_misc_methods", "{{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }} {{ '7'.zfill(3) }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }}")
S("str_percent_format", "{{ '%s is %d years' % ('Tom', 30) }} {{ '%.1f%%' % 12.345 }} {{ 'x=%r' % 'y' }}")
S("str_unicode_methods", "{{ 'ÉCOLE'.lower() }} {{ 'straße'.upper() }} {{ 'ǆ'.title() }} {{ 'héllo'.upper() }}")
S("str_method_on_undefined_error", "{{ nope.startswith('a') }}")
S("str_split_empty_sep_error", "{{ 'abc'.split('') }}")
S("str_index_not_found_error", "{{ 'abc'.index('z') }}")

# --- globals -----------------------------------------------------------------------------------------
S("range_forms", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ range(0) | list }}")
S("range_too_big_error", "{{ range(1000000) | list | length }}")
S("dict_global", "{{ dict(a=1, b='x') }} {{ dict() }} {{ dict({'k': 1}, z=2) }}")
S("raise_exception", "{{ raise_exception('Custom failure: ' ~ 42) }}")
S("raise_exception_in_branch", "{% if messages | length == 0 %}{{ raise_exception('No messages provided.') }}{% endif %}ok", {"messages": []})
S("cycler_joiner", "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner('|') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}")
S("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]")

# --- generation tag (HF AssistantTracker) and loopcontrols --------------------------------------------
S("generation_tag", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}",
  {"msgs": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})

# --- errors with positions ---------------------------------------------------------------------------
S("syntax_unclosed_if", "{% if true %}\nabc\n")
S("syntax_unknown_tag", "line1\n{% frobnicate %}")
S("syntax_bad_expression", "{{ 1 + }}")
S("syntax_unexpected_endfor", "{% endfor %}")
S("syntax_unclosed_variable", "a {{ b ")
S("syntax_unclosed_comment", "a {# b ")
S("syntax_unbalanced_paren", "{{ (1 + 2 }}")
S("syntax_unexpected_char", "{{ 1 ? 2 }}")
S("syntax_include_forbidden", "{% include 'x.html' %}")
S("syntax_extends_forbidden", "{% extends 'base.html' %}")
S("syntax_import_forbidden", "{% import 'macros.html' as m %}")
S("syntax_do_not_enabled", "{% do x.append(1) %}")
S("syntax_multiline_error", "{% for x in y %}\n{{ x }}\n{% endif %}")
S("runtime_error_line", "a\nb\n{{ 'x' + 1 }}")
S("syntax_nondefault_after_default", "{% macro m(a=1, b) %}{% endmacro %}")
S("syntax_assign_to_literal", "{% set 1 = 2 %}")
S("syntax_chained_is", "{{ 1 is number is number }}")

# --- HF-chat-template idioms ---------------------------------------------------------------------------
S("hf_tool_args_walk", "{% for name, value in args | items %}<{{ name }}>{{ value | tojson | safe if value is mapping or (value is sequence and value is not string) else value | string }}</{{ name }}>{% endfor %}",
  {"args": {"city": "Paris", "days": 3, "opts": {"u": "c"}, "l": [1, "a"], "f": 2.5, "b": False, "n": None}})
S("hf_think_split", "{% set c = content %}{% if '</think>' in c %}{% set r = c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}[{{ r }}][{{ c }}]",
  {"content": "<think>\nreasoning here\n</think>\n\nanswer"})
S("hf_last_query_index", "{% set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}{% for message in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}{% if ns.multi_step_tool and message.role == 'user' %}{% set ns.multi_step_tool = false %}{% set ns.last_query_index = index %}{% endif %}{% endfor %}{{ ns.last_query_index }}",
  {"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "tool"}]})
S("hf_bos_eos", "{{ bos_token }}x{{ eos_token }}", {"bos_token": "<s>", "eos_token": "</s>"})
S("hf_content_parts", "{% for item in content %}{% if 'image' in item or 'image_url' in item or item.type == 'image' %}<img>{% elif 'text' in item %}{{ item.text }}{% endif %}{% endfor %}",
  {"content": [{"type": "text", "text": "hi "}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "image"}, {"type": "text", "text": " bye"}]})
S("hf_strftime_type", "{{ strftime_now('%Y') | length }}")
S("hf_messages_none_content_error", "{{ m.content.startswith('x') }}", {"m": {"content": None}})
S("hf_string_sequence_tests", "{{ 'abc' is sequence }}{{ 'abc' is iterable }}{{ {'a': 1} is sequence }}{{ {'a': 1} is iterable }}{{ 5 is iterable }}")


# --- scoping subtleties ----------------------------------------------------------------------------------
S("scope_macro_sees_later_global", "{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}")
S("scope_macro_sees_updated_global", "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}")
S("scope_macro_in_loop", "{% for i in [1, 2] %}{% macro m() %}<{{ i }}>{% endmacro %}{{ m() }}{% endfor %}")
S("scope_loop_var_not_leaking", "{% for i in [1] %}{% set y = i %}{% endfor %}[{{ y }}][{{ i }}]")
S("scope_outer_loop_alias", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}")
S("scope_set_in_if_in_macro", "{% macro m(f) %}{% set r = 'no' %}{% if f %}{% set r = 'yes' %}{% endif %}{{ r }}{% endmacro %}{{ m(true) }}{{ m(false) }}")
S("scope_macro_param_shadows", "{% set a = 'outer' %}{% macro m(a) %}{{ a }}{% endmacro %}{{ m('inner') }}{{ a }}")
S("scope_set_block_in_loop", "{% for i in [1, 2] %}{% set s %}v{{ i }}{% endset %}{{ s }}{% endfor %}[{{ s }}]")
S("scope_namespace_from_macro_arg", "{% macro bump(ns) %}{% set ns.n = ns.n + 1 %}{% endmacro %}{% set c = namespace(n=5) %}{{ bump(c) }}{{ bump(c) }}{{ c.n }}")
S("scope_loop_else_sees_outer", "{% set z = 'outer' %}{% for i in [] %}{% else %}{{ z }}{% endfor %}")

# --- idioms from well-known HF chat templates (Llama 3.x, Mistral, Gemma, DeepSeek, Phi, Granite, Hermes) ----
LLAMA31_LIKE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
LLAMA_CTX = {"bos_token": "<|begin_of_text|>", "add_generation_prompt": True,
             "messages": [{"role": "system", "content": "  Be nice. "}, {"role": "user", "content": "Weather?"},
                          {"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": {"c": "Paris", "n": 2}}}]},
                          {"role": "tool", "content": {"t": 20}}, {"role": "user", "content": "ok"}],
             "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {"c": {"type": "string"}}}}}]}
S("idiom_llama31_tools_in_user", LLAMA31_LIKE, LLAMA_CTX)
S("idiom_llama31_no_tools", LLAMA31_LIKE, {"bos_token": "<|begin_of_text|>", "add_generation_prompt": False,
                                          "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo "}]})
S("idiom_llama31_system_tools", LLAMA31_LIKE, dict(LLAMA_CTX, tools_in_user_message=False, builtin_tools=["brave_search", "code_interpreter"]))
MISTRAL_LIKE = """{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""
S("idiom_mistral_ok", MISTRAL_LIKE, {"bos_token": "<s>", "eos_token": "</s>", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})
S("idiom_mistral_alternation_error", MISTRAL_LIKE, {"bos_token": "<s>", "eos_token": "</s>", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "c"}]})
GEMMA_LIKE = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"""
S("idiom_gemma", GEMMA_LIKE, {"bos_token": "<bos>", "add_generation_prompt": True, "messages": [{"role": "user", "content": " hi \n"}, {"role": "assistant", "content": "yo"}]})
DEEPSEEK_LIKE = """{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"""
S("idiom_deepseek_r1", DEEPSEEK_LIKE, {"bos_token": "<｜begin▁of▁sentence｜>", "add_generation_prompt": True,
                                       "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                                                    {"role": "assistant", "content": "<think>x</think>ans"}, {"role": "user", "content": "q2"}]})
S("idiom_content_parts_join", "{{ message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') }}",
  {"message": {"content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}})
S("idiom_dict_get", "{{ m.get('name', 'anon') }}|{{ m.get('role') }}|{{ m.get('zzz') is none }}", {"m": {"role": "user"}})
S("idiom_json_schema_walk", "{% for name, spec in tool.parameters.properties | dictsort %}{{ name }}:{{ spec.type | upper }}{% if name in tool.parameters.required %}*{% endif %};{% endfor %}",
  {"tool": {"parameters": {"properties": {"b": {"type": "int"}, "a": {"type": "str"}}, "required": ["a"]}}})
S("idiom_granite_date", "{%- set d = strftime_now('%B %d, %Y') %}{{ d is string }}{{ d | length > 5 }}")
S("idiom_not_is_defined", "{{ not x is defined }}{{ not x is defined and true }}")
S("idiom_string_concat_tool_call", "{{- '<tool_call>\\n{\"name\": \"' + tc.name + '\", \"arguments\": ' + tc.arguments | tojson + '}\\n</tool_call>' }}",
  {"tc": {"name": "f", "arguments": {"x": [1, 2], "y": "é"}}})
S("idiom_messages_slice_and_loop_last", "{% for m in messages[1:] %}{{ m }}{{ ',' if not loop.last }}{% endfor %}", {"messages": [0, 1, 2, 3]})
S("idiom_tojson_nested_indent_unicode", "{{ t | tojson(indent=2, ensure_ascii=false) }}", {"t": {"desc": "météo «x»", "l": [{"a": None}, []]}})
S("idiom_trim_blocks_multiline", "<s>\n{% for m in messages %}\n  {% if m.role == 'user' %}\n    [U] {{ m.content }}\n  {% else %}\n    [A] {{ m.content }}\n  {% endif %}\n{% endfor %}\n</s>\n",
  {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})


def render_one(template, context):
    try:
        compiled = _compile_jinja_template(template)
    except jinja2.TemplateSyntaxError as e:
        return {"error": {"type": type(e).__name__, "message": e.message, "line": e.lineno}}
    except Exception as e:  # TemplateAssertionError is a TemplateSyntaxError; anything else: record it
        return {"error": {"type": type(e).__name__, "message": str(e), "line": getattr(e, "lineno", None)}}
    try:
        return {"expected": compiled.render(**context)}
    except Exception as e:
        line = None
        for frame in traceback.extract_tb(e.__traceback__):
            if frame.filename == "<template>":
                line = frame.lineno
        msg = e.message if isinstance(e, jinja2.TemplateError) and e.message is not None else str(e)
        return {"error": {"type": type(e).__name__, "message": msg, "line": line}}


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fixtures", "jinja_goldens.json")
    names = set()
    cases = []
    for name, template, context in SNIPPETS:
        assert name not in names, name
        names.add(name)
        case = {"name": name, "template": template, "context": context}
        case.update(render_one(template, context))
        cases.append(case)
    doc = {
        "generator": "tools/reference/jinja_goldens.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "environment": "transformers _compile_jinja_template: ImmutableSandboxedEnvironment(trim_blocks=True, "
                       "lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]) + HF tojson/raise_exception/strftime_now",
        "cases": cases,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} snippets ({n_err} expected errors) to {out_path}")


if __name__ == "__main__":
    main()
