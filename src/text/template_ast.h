// Internal: the parsed form of a template (see template.h). Expressions and statements are
// plain tagged structs; template_eval.cpp walks them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/template_value.h"

namespace atlas::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    Literal, Name, List, Tuple, Dict,  // Dict: args alternate key, value
    Attr,                              // args[0].name
    Item,                              // args[0][args[1]]
    Slice,                             // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    Call,                              // args[0](args[1:], kwargs)
    Filter,                            // args[0] | name(args[1:], kwargs); args[0] null in filter blocks
    Test,                              // args[0] is [not] name(args[1:])
    Not, Neg, Pos,                     // unary on args[0]
    Binary,                            // args[0] op args[1]: + - * / // % ** ~
    And, Or,                           // short-circuit, Python semantics (returns an operand)
    Compare,                           // args[0] ops[0] args[1] ops[1] args[2] ... (chained)
    Cond,                              // args[1] if args[0] else args[2] (args[2] may be null)
  };
  K k;
  int line = 0, col = 0;
  Value lit;
  std::string name;  // Name / Attr / Filter / Test / Binary operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare: ==, !=, <, <=, >, >=, in, notin
  bool negated = false;          // Test
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class K {
    Text,        // text
    Output,      // {{ expr }}
    If,          // conds[i] -> bodies[i]; bodies.size() == conds.size() + 1 when there is an else
    For,         // for targets in expr [if cond]: bodies[0]; else: bodies[1]
    Set,         // targets = expr; or targets[0].attr = expr (namespace attribute)
    SetBlock,    // {% set targets[0] | filters %}bodies[0]{% endset %}
    Macro,       // name(params = defaults) bodies[0]
    FilterBlock, // {% filter filters %}bodies[0]{% endfilter %}
    With,        // {% with targets = values %}bodies[0]
    Scope,       // bodies[0] rendered in place ({% generation %} blocks)
    Break, Continue,
  };
  K k;
  int line = 0, col = 0;
  std::string text, name, attr;
  ExprPtr expr, cond;
  std::vector<ExprPtr> conds, values, filters;
  std::vector<Body> bodies;
  std::vector<std::string> targets;  // assignment targets; Macro: parameter names
  bool tuple_target = false;         // `for a, b in ...` / `set a, b = ...`
};

}  // namespace atlas::tmpl
