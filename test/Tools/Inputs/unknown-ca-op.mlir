func.func @f(%a: i32) {
  "ca.frobnicate"(%a) : (i32) -> ()
  return
}
