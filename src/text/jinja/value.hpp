// The dynamic value of the template language, modelled on the Python objects jinja2 handles:
// Undefined, None, bool, int, float, str (optionally Markup), list/tuple, dict (insertion order),
// callables (built-ins, bound methods, macros) and a few objects (namespace, loop, cycler).
// Lists, dicts and objects are shared by reference, as in Python; strings and scalars are copied.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace deltaflow::text::jinja {

class Value;
class Interpreter;
struct ListData;
class DictData;
struct FunctionData;
class ObjectData;
struct SeqData;
struct CallArgs;

// Bound methods of objects (loop.changed, cycler.next) keep their object alive through shared_from_this.
struct HeapObject : std::enable_shared_from_this<HeapObject> {
  virtual ~HeapObject() = default;
};

using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

class Value {
 public:
  // kIterable: Python's other iterables that templates meet: generators (map, select, ...), reverse
  // iterators, range objects and dict views. See SeqData.
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunction,
    kObject,
    kIterable
  };

  Value() : i_(0) {}  // Undefined
  static Value undefined(std::string message, bool security = false);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  static Value markup(std::string s);  // a Markup (|safe, |escape) string
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();
  static Value dict(std::shared_ptr<DictData> d);
  static Value function(std::string name, NativeFn fn);
  static Value function(std::shared_ptr<FunctionData> f);
  static Value object(std::shared_ptr<ObjectData> o);
  static Value iterable(std::shared_ptr<SeqData> s);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // list or tuple
  bool is_tuple() const;
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_iterable_object() const { return kind_ == Kind::kIterable; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }

  bool bool_value() const { return i_ != 0; }
  int64_t int_value() const { return i_; }  // bool counts as int, like Python
  double float_value() const { return f_; }
  double number_as_double() const;  // bool, int or float
  const std::string& str() const { return s_; }
  std::string& mutable_str() { return s_; }
  const std::vector<Value>& items() const;
  ListData& list_data() const;
  DictData& dict_data() const;
  FunctionData& function_data() const;
  ObjectData& object_data() const;
  SeqData& seq_data() const;
  const std::shared_ptr<HeapObject>& heap() const { return p_; }

  // Undefined: the message jinja2 raises when the value is used ("'x' is undefined").
  const std::string& undefined_message() const { return s_; }
  bool undefined_is_security() const { return markup_; }

  Value with_markup(bool m) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool markup_ = false;  // Markup flag for strings; "security" flag for Undefined
  union {
    int64_t i_;  // bool and int
    double f_;
  };
  std::string s_;
  std::shared_ptr<HeapObject> p_;
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

struct ListData : HeapObject {
  std::vector<Value> items;
  bool is_tuple = false;
  // Set by groupby: the (grouper, list) pairs also answer `.grouper` and `.list`.
  bool is_group = false;
};

class DictData : public HeapObject {
 public:
  // Python dict semantics: 1, 1.0 and True are one key; the first inserted key object is kept.
  // Returns false when the key is unhashable (list, dict, ...).
  bool set(const Value& key, Value value);
  const Value* get(const Value& key) const;
  const Value* get_str(const std::string& key) const;
  size_t size() const { return entries.size(); }
  std::vector<std::pair<Value, Value>> entries;  // insertion order

 private:
  std::unordered_map<std::string, size_t> str_index_;
  std::unordered_map<std::string, size_t> other_index_;
};

struct FunctionData : HeapObject {
  std::string name;
  NativeFn fn;
  bool is_macro = false;
  std::vector<std::string> arguments;  // macro parameter names, for `m.arguments`
  bool catch_varargs = false, catch_kwargs = false, caller = false;
};

enum class SeqKind : uint8_t { kGenerator, kIterator, kRange, kDictKeys, kDictValues, kDictItems };

struct SeqData : HeapObject {
  SeqKind kind = SeqKind::kGenerator;
  // Generators: the Python function name for repr ("sync_do_map"); iterators: the type
  // ("list_reverseiterator").
  std::string name;
  // Ranges and views: the elements. Iterators: the elements until consumed.
  std::vector<Value> items;
  // Generators run lazily on first iteration (errors surface then, as in Python) and are single-use.
  std::function<std::vector<Value>(Interpreter&)> producer;
  bool consumed = false;
  int64_t start = 0, stop = 0, step = 1;  // ranges
};

// Objects with attributes: namespace, loop, cycler.
class ObjectData : public HeapObject {
 public:
  virtual std::string type_name() const = 0;    // Python class name, e.g. "Namespace"
  virtual std::string module_name() const = 0;  // e.g. "jinja2.utils", for "'x object' has no attribute"
  virtual bool get_attr(Interpreter& in, const std::string& name, Value* out) = 0;
  virtual bool set_attr(const std::string&, const Value&) { return false; }
  virtual bool is_namespace() const { return false; }
  virtual bool call(Interpreter&, CallArgs&, Value*) { return false; }  // false: not callable
  virtual std::string repr() const;
};

inline bool Value::is_tuple() const {
  return kind_ == Kind::kList && list_data().is_tuple;
}
inline const std::vector<Value>& Value::items() const {
  return list_data().items;
}
inline ListData& Value::list_data() const {
  return *static_cast<ListData*>(p_.get());
}
inline DictData& Value::dict_data() const {
  return *static_cast<DictData*>(p_.get());
}
inline FunctionData& Value::function_data() const {
  return *static_cast<FunctionData*>(p_.get());
}
inline ObjectData& Value::object_data() const {
  return *static_cast<ObjectData*>(p_.get());
}
inline SeqData& Value::seq_data() const {
  return *static_cast<SeqData*>(p_.get());
}

// Python's str(), repr(), bool() and ==.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python's type name ("int", "str", "NoneType", "list", ...), and jinja2's object_type_repr
// ("dict object", "None") used in undefined messages.
std::string type_name(const Value& v);
std::string object_type_repr(const Value& v);
// The key used for dict hashing; nullopt when the value is unhashable.
std::optional<std::string> hash_key(const Value& v);

// JSON in: objects keep their key order (ordered_json) or come sorted (json). Numbers: integers that fit
// int64 stay ints, everything else becomes float.
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);
// Values back to JSON (for tests and the server); Undefined and callables fail.
bool to_json(const Value& v, nlohmann::ordered_json* out);

// Python json.dumps options (HF's tojson: ensure_ascii=False, indent=None, separators=None, sort_keys=False).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;                              // the indent unit; nullopt: single line
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
  bool sort_keys = false;
};
// Appends json.dumps(v) to out. On failure returns false and sets *error to Python's TypeError message.
bool json_dumps(const Value& v, const JsonDumpOptions& opt, std::string* out, std::string* error);

}  // namespace deltaflow::text::jinja
